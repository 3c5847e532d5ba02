"""A PBT sweep (``hydra/sweeper=pbt``) drawn from its ``pbt.jsonl`` and its segments' metrics: each
member's curve of the metric it was ranked by, with a dashed jump where it copied another member,
and below it the schedule of each mutated setting the members followed.

    python -m fiberrl.plot <sweep dir> -o pbt.png      (fiberrl.plot hands a folder holding pbt.jsonl here)
"""
import json
import math
from pathlib import Path

from .run import metrics_row

LINEAGE = "pbt.jsonl"


class PBTPlotError(ValueError):
    """A sweep folder that cannot be drawn; reported as one line."""


def is_pbt_sweep(path) -> bool:
    return (Path(path) / LINEAGE).is_file()


def read_sweep(sweep_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    """(the sweep's settings, its segments in the order they began with what they logged, its exploits)."""
    settings, segments, exploits = None, {}, []
    for number, line in enumerate((sweep_dir / LINEAGE).read_text().split("\n"), start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a last line cut short: the sweeper drops it too
        kind = event.get("event")
        if kind == "sweep":
            settings = event["settings"]
        elif kind == "segment":
            segments[(event["member"], event["segment"])] = dict(event, end=None, rows=[])
        elif kind == "ended" and (event["member"], event["segment"]) in segments:
            segments[(event["member"], event["segment"])]["end"] = event["timesteps"]
        elif kind == "exploit":
            exploits.append(event)
    if settings is None:
        raise PBTPlotError(f"{sweep_dir / LINEAGE} does not begin with the sweep's settings")
    for segment in segments.values():
        path = sweep_dir / segment["folder"] / "metrics.jsonl"
        if path.is_file():
            segment["rows"] = [row for text in path.read_text(errors="replace").split("\n")
                               if (row := metrics_row(text)) is not None]
    return settings, list(segments.values()), exploits


def plot_pbt(sweep_dir, out_path="pbt.png") -> Path:
    sweep_dir, out_path = Path(sweep_dir), Path(out_path)
    if not out_path.parent.is_dir():
        raise PBTPlotError(f"-o {out_path}: the folder {out_path.parent} does not exist")
    settings, segments, exploits = read_sweep(sweep_dir)
    metric = settings["metric"]
    keys = list(segments[0]["settings"]) if segments else []
    if not any(_points(s, metric)[0] for s in segments):
        raise PBTPlotError(f"no member has logged {metric} yet")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1 + len(keys), 1, figsize=(11, 4.5 + 2.0 * len(keys)), sharex=True,
                             gridspec_kw={"height_ratios": [2.5] + [1] * len(keys)})
    axes = list(axes) if len(keys) else [axes]
    # where each segment began, to draw the settings it ran with from there
    by_key = {(s["member"], s["segment"]): s for s in segments}
    for segment in segments:
        color = f"C{segment['member'] % 10}"
        xs, ys = _points(segment, metric)
        # each segment drawn from the point it went on from: its member's last, or (dashed before it) the
        # last of the member it copied
        source = by_key.get(_source(segment))
        before = by_key.get((segment["member"], segment["segment"] - 1))
        if source is not None and _points(source, metric)[0]:
            sx, sy = _points(source, metric)
            xs, ys = [sx[-1]] + xs, [sy[-1]] + ys
            if source is not before and before is not None and _points(before, metric)[0]:
                bx, by = _points(before, metric)
                axes[0].plot([bx[-1], sx[-1]], [by[-1], sy[-1]], color=color, linestyle="--", linewidth=0.9)
                axes[0].plot([sx[-1]], [sy[-1]], color=color, marker="o", markersize=3.5)
        axes[0].plot(xs, ys, color=color, linewidth=1.2, marker="." if len(xs) == 1 else None,
                     label=f"member {segment['member']}" if segment["segment"] == 0 else None)
        start = source["end"] if source is not None and source["end"] is not None else 0
        end = segment["end"] if segment["end"] is not None else (xs[-1] if xs else start)
        for ax, key in zip(axes[1:], keys):
            ax.plot([start, end], [segment["settings"][key]] * 2, color=color, linewidth=1.5)
    axes[0].set_ylabel(metric)
    axes[0].set_title(f"PBT: {settings['population']} members, ready every {settings['interval']:,} env steps, "
                      f"{len(exploits)} exploits (dashed: a member copies another)")
    axes[0].legend(fontsize="small", ncol=min(4, settings["population"]))
    for ax, key in zip(axes[1:], keys):
        ax.set_ylabel(key.split(".")[-1])
        values = [s["settings"][key] for s in segments if _number(s["settings"][key])]
        if values and min(values) > 0 and max(values) > 10 * min(values):  # spread over decades
            ax.set_yscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("environment timesteps")
    fig.tight_layout()
    try:
        fig.savefig(out_path, dpi=100)
    except ValueError as exc:
        raise PBTPlotError(f"-o {out_path}: {exc}") from None
    finally:
        plt.close(fig)
    return out_path


def _source(segment: dict) -> tuple | None:
    """(member, segment) of the checkpoint a segment went on from, or None for a member's first."""
    source = segment.get("start_from")
    if not source:
        return None
    member, index = Path(source).parts[:2]
    return int(member.split("_")[1]), int(index.split("_")[1])


def _points(segment: dict, metric: str) -> tuple[list, list]:
    rows = [r for r in segment["rows"] if _number(r.get(metric)) and _number(r.get("timesteps"))]
    return [r["timesteps"] for r in rows], [r[metric] for r in rows]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
