"""Draw learning curves of one or more runs to a PNG.

    python -m fiberrl.plot <run dir or folder of runs>... [-o curves.png]
                           [--metric eval_reward|reward_mean|reward_max|charts/episodic_return]
    python -m fiberrl.plot <PBT sweep dir> -o pbt.png     (fiberrl.plot_pbt: members, exploits, schedules)

Two panels: the metric against environment timesteps and against wall time.
Runs whose config.yaml differ only in ``seed`` (and in settings that do not
change the result: backend, resume, tensorboard, and for ES workers) form one group,
drawn as the mean over its seeds with a band from the lowest to the highest
seed.  Groups are labelled by algorithm / environment plus the settings in
which they differ.  A folder that is not itself a run (a Hydra multirun
folder, ``runs/``) stands for every run below it.  ``eval_reward`` falls back
to ``reward_mean`` (ES) or ``charts/episodic_return`` (PPO's training episodes)
for a group in which some run logged no eval rewards.

From Python: ``plot_runs(run_dirs, out_path, metric)`` and ``group_runs(run_dirs)``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from .algorithm import ALGORITHMS, RESUME_MAY_CHANGE, algorithm
from .run import flatten as flatten_keys

METRICS = ("eval_reward", "reward_mean", "reward_max", "charts/episodic_return")
# runs that differ only in these are seeds of one configuration
NOT_GROUPED_BY = RESUME_MAY_CHANGE | {"seed"}
# what eval_reward falls back to, in order, for a group in which some run logged none:
# ES's mean return of its perturbed episodes, PPO's of its training episodes
FALLBACKS = ("reward_mean", "charts/episodic_return")
# points on the common x axis a group's seeds are interpolated onto
GRID_POINTS = 200
X_AXES = (("timesteps", "environment timesteps"), ("time_s", "wall time (s)"))


class PlotError(ValueError):
    """Input the tool cannot plot; reported as one line."""


@dataclass
class Run:
    path: Path
    config: dict | None          # None: the run has no readable config.yaml
    metrics: list[dict] = field(repr=False)

    @property
    def seed(self):
        return (self.config or {}).get("seed")


def find_runs(paths) -> list[Path]:
    """The run directories (those holding metrics.jsonl) among ``paths`` and below the folders in it."""
    runs: list[Path] = []
    for given in map(Path, paths):
        if not given.exists():
            raise PlotError(f"{given}: no such file or directory")
        if (given / "metrics.jsonl").is_file():
            found = [given]
        elif given.is_dir():
            found = sorted(p.parent for p in given.rglob("metrics.jsonl"))
        else:
            found = []
        if not found:
            raise PlotError(f"{given} is not a run directory and holds none (no metrics.jsonl found)")
        runs += [p for p in found if p not in runs]
    return runs


def read_metrics(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a run killed mid-write leaves a partial last line
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_run(path: Path) -> Run:
    try:
        config = yaml.safe_load((path / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        config = None
    return Run(path, config if isinstance(config, dict) else None, read_metrics(path / "metrics.jsonl"))


def flatten(config: dict) -> dict:
    """{"algo.sigma": 0.02, ...}; lists become tuples so values compare and hash."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in flatten_keys(config).items()}


def _not_grouped_by(config: dict) -> set:
    name = (config.get("algo") or {}).get("name") if isinstance(config.get("algo"), dict) else None
    if name not in ALGORITHMS:
        return NOT_GROUPED_BY
    return algorithm(name).app_resume_may_change | {"seed"}


def _settings(run: Run) -> dict:
    flat = flatten(run.config or {})
    ignored = _not_grouped_by(run.config or {})
    return {k: v for k, v in flat.items() if k.split(".", 1)[0] not in ignored}


def _group_key(run: Run) -> str:
    if run.config is None:  # nothing says which runs it belongs with
        return f"path:{run.path}"
    return json.dumps(sorted(_settings(run).items()), default=str)


def _label(runs: list[Run], differing: list[str]) -> str:
    first = runs[0]
    if first.config is None:
        return str(first.path)
    settings = _settings(first)
    label = f"{settings.get('algo.name', '?')} / {settings.get('env.name', settings.get('env.id', '?'))}"
    shown = [f"{key}={_format(settings.get(key))}" for key in differing]
    if shown:
        label += ", " + ", ".join(shown)
    if len(runs) > 1:
        seeds = {run.seed for run in runs}
        label += f" ({len(runs)} seeds)" if len(seeds) == len(runs) else f" ({len(runs)} runs)"
    return label


def _format(value) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _group(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(_group_key(run), []).append(run)
    configured = [members[0] for members in groups.values() if members[0].config is not None]
    keys = sorted({k for run in configured for k in _settings(run)} - {"algo.name", "env.name"})
    differing = [k for k in keys if len({json.dumps(_settings(run).get(k), default=str) for run in configured}) > 1]
    labelled: dict[str, list[Run]] = {}
    for members in groups.values():
        label = base = _label(members, differing)
        n = 2
        while label in labelled:
            label, n = f"{base} #{n}", n + 1
        labelled[label] = members
    return labelled


def group_runs(run_dirs) -> dict[str, list[Run]]:
    """{label: runs} for the runs in ``run_dirs`` (run directories or folders of them)."""
    return _group([read_run(path) for path in find_runs(run_dirs)])


def _points(run: Run, x_key: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    pairs = [(row.get(x_key), row.get(metric)) for row in run.metrics]
    pairs = [(x, y) for x, y in pairs if _number(x) and _number(y)]
    xs = np.array([x for x, _ in pairs], dtype=float)
    ys = np.array([y for _, y in pairs], dtype=float)
    order = np.argsort(xs, kind="stable")
    return xs[order], ys[order]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def group_metric(runs: list[Run], metric: str) -> str:
    """``metric``, or when it is eval_reward and some run of the group logged none, the first of
    ``FALLBACKS`` every run logged (the whole group switches, so its seeds stay comparable)."""
    def logged_by_all(name):
        return all(any(_number(row.get(name)) for row in run.metrics) for run in runs)
    if metric != "eval_reward" or logged_by_all(metric):
        return metric
    return next((name for name in FALLBACKS if logged_by_all(name)), FALLBACKS[0])


def band(curves: list[tuple[np.ndarray, np.ndarray]]):
    """(x grid, mean, min, max) of the curves, on the x range every one of them covers."""
    low = max(xs[0] for xs, _ in curves)
    high = min(xs[-1] for xs, _ in curves)
    if high <= low:
        return None
    grid = np.linspace(low, high, GRID_POINTS)
    values = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def plot_runs(run_dirs, out_path="curves.png", metric: str = "eval_reward") -> Path:
    """Draw the learning curves of the runs in ``run_dirs`` into ``out_path``; returns the path."""
    if metric not in METRICS:
        raise PlotError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    out_path = Path(out_path)
    if not out_path.parent.is_dir():
        raise PlotError(f"-o {out_path}: the folder {out_path.parent} does not exist")
    groups = group_runs(run_dirs)
    if not any(run.metrics for runs in groups.values() for run in runs):
        raise PlotError("no run has logged any metrics yet (every metrics.jsonl is empty)")

    import matplotlib
    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8 + 0.3 * len(groups)), sharey=True)
    used = set()
    for index, (label, runs) in enumerate(groups.items()):
        name = group_metric(runs, metric)
        used.add(name)
        shown = label if name == metric else f"{label} [{name}]"
        color = f"C{index % 10}"
        for ax, (x_key, _) in zip(axes, X_AXES, strict=True):
            _draw(ax, [_points(run, x_key, name) for run in runs], color, shown)
    ylabel = " / ".join(m for m in METRICS if m in used)
    for ax, (_, xlabel) in zip(axes, X_AXES, strict=True):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    # below both panels: long labels would cover the curves
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize="small", loc="lower center", ncol=1, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"{ylabel} of {sum(map(len, groups.values()))} run(s)")
    fig.tight_layout(rect=(0, 0.04 + 0.045 * len(labels), 1, 1))
    try:
        fig.savefig(out_path, dpi=100)
    except ValueError as exc:  # an extension matplotlib does not write
        raise PlotError(f"-o {out_path}: {exc}") from None
    finally:
        plt.close(fig)
    return out_path


def _draw(ax, curves: list, color: str, label: str) -> None:
    curves = [(xs, ys) for xs, ys in curves if len(xs)]
    if not curves:
        return
    summary = band(curves) if len(curves) > 1 else None
    if summary is not None:
        grid, mean, low, high = summary
        ax.plot(grid, mean, color=color, label=label)
        ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
        return
    # one run, or seeds with no x range in common: each drawn as it is
    for i, (xs, ys) in enumerate(curves):
        ax.plot(xs, ys, color=color, label=label if i == 0 else None, marker="." if len(xs) == 1 else None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fiberrl.plot",
                                     description="Draw learning curves of runs (grouped over seeds) to a PNG.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories, or folders holding them (e.g. runs/multirun/<time>)")
    parser.add_argument("-o", "--output", default="curves.png", help="image to write (default curves.png)")
    parser.add_argument("--metric", choices=METRICS, default="eval_reward",
                        help="what to plot (default eval_reward, reward_mean for runs without eval rewards)")
    args = parser.parse_args(argv)
    from .plot_pbt import PBTPlotError, is_pbt_sweep, plot_pbt
    try:
        if len(args.runs) == 1 and is_pbt_sweep(args.runs[0]):
            path = plot_pbt(args.runs[0], args.output)
        else:
            path = plot_runs(args.runs, args.output, args.metric)
    except (PlotError, PBTPlotError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
