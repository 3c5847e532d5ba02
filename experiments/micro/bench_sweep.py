"""A sweep of small ES CartPole runs under each Hydra launcher: wall time and the launcher's own cost per run.

    python experiments/micro/bench_sweep.py [--runs 8] [--iterations 8] [--population 64] [--repeats 2]
                                            [--backend local|docker|slurm] [--launchers basic,fiberrl,...]
                                            [--run-overrides 'algo.noise_seed=${seed}' ...]

The same runs (``seed=0..runs-1``, one worker each) are swept by Hydra's basic launcher (one after
another, in the sweep's process), ``hydra/launcher=fiberrl`` (each run a job, as many at once as
the machine's cores fit), hydra-joblib-launcher (loky processes, n_jobs=-1) and
hydra-submitit-launcher's local mode (a subprocess per run), in alternating order, each repeat
in a fresh sweep folder. Then each launcher one run at a time (runs_at_once=1, n_jobs=1; submitit's
local mode cannot), where the launcher's own cost per run is the gap between one run's last write
and the next run's first (Hydra's .hydra/config.yaml, written as the task starts): spawning the
run's process, importing the app, composing its config, handing back its result. The same gap
under the basic launcher, which runs the task in its own process, is its floor.

The peers are installed, on first use, into a folder of the bench's own (``--peers``, put on
PYTHONPATH for their sweeps only), never into the project's environment. With ``--backend docker``
or ``slurm`` the basic and fiberrl launchers sweep with every process a job of that backend (the
test suite's Docker image, since none can be pulled here); the peers do not start jobs there.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ["hydra-joblib-launcher==1.2.0", "hydra-submitit-launcher==1.2.0", "submitit", "joblib"]
# name: (overrides, runs at once, needs the peers)
LAUNCHERS = {
    "basic": (["hydra/launcher=basic"], "1", False),
    "fiberrl": ([], "cores", False),
    "joblib": (["hydra/launcher=joblib"], "cores", True),
    "submitit_local": (["hydra/launcher=submitit_local"], "all", True),
}
# submitit's local mode has no setting for it: it starts every run at once
ONE_AT_A_TIME = {
    "basic": [],
    "fiberrl": ["hydra.launcher.runs_at_once=1"],
    "joblib": ["hydra.launcher.n_jobs=1"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--population", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", default="local", choices=["local", "docker", "slurm"])
    parser.add_argument("--peers", default=str(ROOT / "experiments" / ".peers" / "sweep"))
    parser.add_argument("--no-one-at-a-time", action="store_true", help="skip the per-run cost sweeps")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="which to sweep with (basic among them)")
    parser.add_argument("--run-overrides", nargs="*", default=[],
                        help="more overrides for every run, e.g. 'algo.noise_seed=${seed}' (each run draws a noise "
                             "table of its own, as before runs shared one)")
    parser.add_argument("--faults", action="store_true",
                        help="instead: a sweep in which one run's job is SIGKILLed mid-way and another run raises")
    args = parser.parse_args()
    if args.faults:
        return faults(args)

    backend = backend_overrides(args.backend)
    names = [n for n in args.launchers.split(",") if args.backend == "local" or n in ("basic", "fiberrl")]
    if not {"basic", "fiberrl"} <= set(names) or any(n not in LAUNCHERS for n in names):
        sys.exit(f"bench_sweep: --launchers {args.launchers}: a list of {', '.join(LAUNCHERS)} that holds basic "
                 f"and fiberrl")
    if any(LAUNCHERS[name][2] for name in names):
        install_peers(Path(args.peers))
    runs = ["algo=es", "env=cartpole", "workers=1", f"algo.iterations={args.iterations}",
            f"algo.population={args.population}", "tensorboard=false",
            "seed=" + ",".join(map(str, range(args.runs))), *backend, *args.run_overrides]
    scratch = Path(tempfile.mkdtemp(prefix="bench-sweep-", dir=ROOT / "runs" if args.backend == "docker" else None))
    print(f"bench_sweep: {args.runs} ES CartPole runs ({args.iterations} iterations of {args.population} "
          f"perturbations, 1 worker each) on the "
          f"{args.backend} backend, {os.cpu_count()} cores; {args.repeats} repeats in alternating order\n")
    walls: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in (names if repeat % 2 == 0 else names[::-1]):
            walls[name].append(sweep(name, LAUNCHERS[name][0], runs, scratch / f"{name}-{repeat}", args))
    single: dict[str, list[float]] = {}
    gap: dict[str, list[float]] = {}
    if not args.no_one_at_a_time:
        for repeat in range(args.repeats):
            for name in [n for n in (names if repeat % 2 == 0 else names[::-1]) if n in ONE_AT_A_TIME]:
                extra = LAUNCHERS[name][0] + ONE_AT_A_TIME[name]
                folder = scratch / f"{name}-one-{repeat}"
                single.setdefault(name, []).append(sweep(name, extra, runs, folder, args))
                gap.setdefault(name, []).extend(gaps_between_runs(folder))
    shutil.rmtree(scratch, ignore_errors=True)

    basic = mean(walls["basic"])
    print(f"\n{'launcher':<15} {'runs at once':>12} {'wall s (each repeat)':>22} {'mean s':>7} {'x basic':>8}"
          f" {'one at a time s':>16} {'gap between runs s':>19}")
    for name in names:
        at_once = {"1": "1", "cores": str(os.cpu_count()), "all": str(args.runs)}[LAUNCHERS[name][1]]
        if name == "fiberrl" and args.backend != "local":
            at_once = str(args.runs)  # a cluster backend's default: every run, the cluster queues them
        between = f"{mean(gap[name]):.2f} ({min(gap[name]):.2f}-{max(gap[name]):.2f})" if gap.get(name) else "-"
        print(f"{name:<15} {at_once:>12} {' '.join(f'{w:.1f}' for w in walls[name]):>22} "
              f"{mean(walls[name]):>7.1f} {mean(walls[name]) / basic:>8.2f}"
              f" {(f'{mean(single[name]):.1f}' if name in single else '-'):>16} {between:>19}")
    ratio = mean(walls["fiberrl"]) / basic
    own = mean(gap["fiberrl"]) - mean(gap["basic"]) if gap else float("nan")
    print(f"\nbench_sweep: backend={args.backend} runs={args.runs} fiberrl_vs_basic={ratio:.2f} "
          f"fiberrl_own_cost_per_run_s={own:.2f}"
          + ("".join(f" {name}_vs_basic={mean(walls[name]) / basic:.2f}" for name in names
                     if name not in ("basic", "fiberrl")))
          + ("".join(f" {name}_own_cost_per_run_s={mean(gap[name]) - mean(gap['basic']):.2f}" for name in gap
                     if name not in ("basic", "fiberrl"))))


def sweep(name: str, launcher: list[str], runs: list[str], folder: Path, args) -> float:
    env = dict(os.environ)
    if LAUNCHERS[name][2]:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.peers, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "fiberrl", "-m", *runs, *launcher, f"hydra.sweep.dir={folder}"]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"bench_sweep: the {name} sweep failed ({done.returncode}):\n{done.stderr[-3000:]}")
    finished = finished_runs(folder, args.iterations)
    if finished != args.runs:
        sys.exit(f"bench_sweep: the {name} sweep finished {finished} of {args.runs} runs; see {folder}")
    print(f"  {name:<15} {' '.join(launcher[1:]) or '(defaults)':<40} {wall:6.1f} s", flush=True)
    return wall


def faults(args) -> None:
    """Three runs of one seed that differ only in their checkpoint cadence (so they compute the same):
    #0's job is SIGKILLed after its first checkpoint, #1 runs undisturbed, #2's checkpoint folder is
    replaced by a file after its first checkpoint, so that its next checkpoint raises."""
    import signal
    folder = Path(tempfile.mkdtemp(prefix="bench-sweep-faults-")) / "sweep"
    command = [sys.executable, "-m", "fiberrl", "-m", "algo=es", "env=cartpole", "workers=1", "seed=0",
               f"algo.iterations={args.iterations}", f"algo.population={args.population}", "tensorboard=false",
               "algo.checkpoint_every=2,3,4", *backend_overrides(args.backend), f"hydra.sweep.dir={folder}",
               "hydra.sweep.subdir=${hydra.job.num}", "hydra.launcher.runs_at_once=3", "hydra.launcher.table=plain"]
    print(f"bench_sweep --faults: {' '.join(command[2:])}", flush=True)
    sweep = subprocess.Popen(command, cwd=ROOT, text=True)
    killed = broken = False
    while sweep.poll() is None and not (killed and broken):
        time.sleep(0.2)
        if not killed and any((folder / "0" / "checkpoints").glob("*.npz")):
            where = json.loads((folder / "0" / ".hydra" / "job_where.json").read_text())
            os.kill(where["pid"], signal.SIGKILL)
            killed = True
            print(f"bench_sweep --faults: SIGKILLed run #0's job (pid {where['pid']})", flush=True)
        if not broken and any((folder / "2" / "checkpoints").glob("*.npz")):
            shutil.rmtree(folder / "2" / "checkpoints")
            (folder / "2" / "checkpoints").write_text("not a folder\n")
            broken = True
            print("bench_sweep --faults: replaced run #2's checkpoints/ by a file", flush=True)
    sweep.wait()
    print(f"\nthe sweep exited with {sweep.returncode}; {folder / 'sweep.csv'}:")
    print((folder / "sweep.csv").read_text())
    same = metrics_without_timing(folder / "0") == metrics_without_timing(folder / "1")
    print(f"bench_sweep --faults: run #0 (killed, retried from its checkpoint) computed "
          f"{'the same metrics as' if same else 'OTHER METRICS THAN'} run #1 (never interrupted) over "
          f"{len(metrics_without_timing(folder / '1'))} iterations")


def metrics_without_timing(run: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in m.items() if not k.endswith("_s") and k != "wall_time"
             and "utilisation" not in k} for m in lines]


def gaps_between_runs(folder: Path) -> list[float]:
    """Seconds from each run's last write to the next run's first, in job order (one run at a time)."""
    runs = sorted((p for p in folder.iterdir() if (p / ".hydra" / "config.yaml").is_file()),
                  key=lambda p: int(p.name.split("_", 1)[0]))
    spans = [((run / ".hydra" / "config.yaml").stat().st_mtime,
              max(f.stat().st_mtime for f in run.rglob("*") if f.is_file())) for run in runs]
    return [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]


def finished_runs(folder: Path, iterations: int) -> int:
    count = 0
    for metrics in folder.glob("*/metrics.jsonl"):
        lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        count += bool(lines) and lines[-1]["iteration"] == iterations - 1
    return count


def backend_overrides(backend: str) -> list[str]:
    if backend == "local":
        return ["backend=local"]
    sys.path.insert(0, str(ROOT / "tests"))
    helper = importlib.import_module(f"helpers.{backend}_backend")
    reason = helper.available()
    if reason:
        sys.exit(f"bench_sweep: the {backend} backend cannot run here: {reason}")
    settings = {k: v for k, v in helper.settings().items() if k != "backend"}
    return [f"backend={backend}", *[f"backend.settings.{k}={v}" for k, v in settings.items()]]


def install_peers(folder: Path) -> None:
    if (folder / "hydra_plugins" / "hydra_joblib_launcher").is_dir():
        return
    print(f"installing {', '.join(PEERS)} into {folder} (the bench's own, not the project's)", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), *PEERS],
                   check=True)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


if __name__ == "__main__":
    main()
