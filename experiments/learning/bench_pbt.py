"""Population Based Training of PPO on BipedalWalker-v3, from deliberately poor starting values
(learning rate 3e-3, entropy coefficient 0.02, clip 0.4, GAE lambda 0.8; the preset has 3e-4, 0, 0.18,
0.95), at a budget this machine affords:

- (a) ``pbt``: fiberrl's ``hydra/sweeper=pbt`` mutating PPO's usual set (those four settings); ``pbt-ttest``:
  the same with Jaderberg et al.'s t-test selection (``hydra.sweeper.selection=ttest``) in place of truncation;
  ``pbt-ready``: truncation with each member ranked as it stood at its own last ready point and copied only from
  one where it ranked on top (``hydra.sweeper.ranking=ready``, Ray Tune's rules); ``pbt-sync``: generational
  (``hydra.sweeper.synchronous=true``), every member waiting for the others at each ready point;
  ``pbt-ttest-sync``: the t-test, generational; ``pbt-pb2``, ``pbt-pb2-sync``: truncation with each copy's settings
  chosen by PB2's Gaussian-process bandit (``hydra.sweeper.explore=pb2``), asynchronous and generational;
- (b) ``independent``: the same members (seeds, starting values) trained independently, a plain
  ``-m`` sweep of the ``hydra/launcher=fiberrl`` launcher;
- (c) ``ray``: Ray Tune's ``PopulationBasedTraining`` driving the same fiberrl PPO as a function
  trainable (``pbt_ray_peer.py``, in ``--ray-python``: Ray is not a project dependency), with the same
  population, interval, quantile, mutations and metric; ``ray-sync``: the same with Ray's ``synch=True``.
- ``preset``: the same members trained independently from the preset's own settings (not the poor ones):
  what the settings PBT searches reach at this budget when they are good from the start.

Every member runs ``+experiment=ppo_bipedal_walker`` with a smaller batch (2 env servers of 8 envs,
512 steps each: 8,192 env steps an update, minibatches of 64), evaluated (3 episodes on its mean
action) every 4 updates and checkpointed every 2 (what a PBT member copies of a running one);
members are ranked by the mean of their last 3 evaluations.  All members of a sweep run at the same
time.  Per sweep: every member's final policy over ``--eval-episodes`` episodes (episode i reset with
seed 10,000 + i, the same episodes for all): the best member's (the best by that ranking) and the
population's mean; the population's mean of the ranking metric at the end; the sweep's wall time
(with --final-episodes, up to its named best: the PBT sweeper's holds its own final selection, the
others' the same selection made here). Sweeps run one after another, seed by seed, in the order
--which gives (pbt, independent, ray unless told); a sweep whose result
is in OUT/results.json is kept, a fiberrl sweep cut short is resumed by its own command, a Ray sweep
cut short starts again.  Each result records its ``conditions`` (date, CPU, budget, --set, starting
values): one member's runs repeat to the last digit on one machine, not on another, so only sweeps run
on the same machine compare (use a fresh --out on a new machine).

    python experiments/learning/bench_pbt.py --out experiments/results/pbt_bipedal/<date> \\
        --ray-python /tmp/venv-ray/bin/python
    python experiments/learning/bench_pbt.py --out /tmp/pbt_smoke --member-steps 32768 --interval 16384 \\
        --seeds 0 --eval-episodes 2                                              # a smoke test

Flags: --seeds (default 0 1), --population (4), --member-steps (491,520 env steps each: 60 updates), --interval
(81,920 = 10 updates), --burn-in (0: env steps before a member may copy another, in both PBTs), --which (pbt
independent ray; or pbt-ttest, pbt-ready, pbt-sync, pbt-ttest-sync, pbt-pb2, pbt-pb2-sync, ray-sync, preset),
--eval-episodes (100), --ray-python (default: this interpreter; without Ray the peer is skipped with the reason),
--final-episodes N (0: each sweep's best member is the best by the ranking metric; N: the best mean return of each
member's final policy over N other episodes, seeded 1,000,000 + i: the PBT sweeper's ``hydra.sweeper.final_episodes``,
and the same selection made here for the other sweeps), --set KEY=VALUE (a setting added to every member of every
sweep, e.g. ``algo.anneal_lr=false``: a constant learning rate), --start KEY=VALUE (a mutated setting's poor start
in place of the one above, for every sweep), --reselect (no sweep runs: the sweeps in OUT/results.json whose folders
are still there get their best named again by --final-episodes). Stopped (SIGTERM, Ctrl-C), it ends the sweep it
was running.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_python import missing_imports  # noqa: E402

EVAL_SEED = 10_000
FINAL_SEED = 1_000_000  # the final selection's episodes: none of the scored ones
WINDOW = 3
QUANTILE = 0.25
# fiberrl's sweeper, as --which names it
PBT_KINDS = ("pbt", "pbt-ttest", "pbt-ready", "pbt-sync", "pbt-ttest-sync", "pbt-pb2", "pbt-pb2-sync")
POOR = {"algo.learning_rate": 3e-3, "algo.ent_coef": 0.02, "algo.clip_coef": 0.4, "algo.gae_lambda": 0.8}


def fixed(args) -> list[str]:
    return ["+experiment=ppo_bipedal_walker", "algo.envs_per_worker=8", "algo.num_steps=512",
            "algo.num_minibatches=128", "algo.eval_every=4", "algo.eval_episodes=3", "algo.checkpoint_every=2",
            f"algo.total_timesteps={args.member_steps}", "tensorboard=false", *args.set]


def poor() -> list[str]:
    return [f"{key}={value}" for key, value in POOR.items()]


def set_poor(starts: list[str]) -> None:
    """``--start KEY=VALUE``: a mutated setting's poor start, in place of the one above, for every sweep."""
    for start in starts:
        key, _, value = start.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if key not in POOR or number is None:
            raise SystemExit(f"--start {start}: give one of {', '.join(POOR)} as KEY=NUMBER")
        POOR[key] = number


def run_pbt(args, seed: int, folder: Path, selection: str = "truncation", ranking: str = "now",
            synchronous: bool = False, explore: str = "perturb") -> tuple[list[tuple[Path, float]], float]:
    command = [sys.executable, "-m", "fiberrl", "-m", "hydra/sweeper=pbt", *fixed(args), *poor(),
               f"seed={100 * seed}", f"hydra.sweeper.population={args.population}",
               f"hydra.sweeper.interval={args.interval}", f"hydra.sweeper.window={WINDOW}",
               f"hydra.sweeper.quantile={QUANTILE}", f"hydra.sweeper.seed={seed}", f"hydra.sweep.dir={folder}",
               f"hydra.sweeper.burn_in={args.burn_in}", f"hydra.sweeper.selection={selection}",
               f"hydra.sweeper.ranking={ranking}", f"hydra.sweeper.synchronous={str(synchronous).lower()}",
               f"hydra.sweeper.explore={explore}",
               f"hydra.launcher.runs_at_once={args.population}", "hydra.launcher.table=plain"]
    if args.final_episodes:
        command += [f"hydra.sweeper.final_episodes={args.final_episodes}", f"hydra.sweeper.final_seed={FINAL_SEED}"]
    wall = _timed(command, folder.parent / f"{folder.name}.log")
    return pbt_members(folder, args.population), wall


def pbt_members(folder: Path, population: int) -> list[tuple[Path, float]]:
    members = []
    events = [json.loads(line) for line in (folder / "pbt.jsonl").read_text().splitlines() if line.strip()]
    for member in range(population):
        ended = [e for e in events if e["event"] == "ended" and e["member"] == member]
        last = ended[-1]
        segment = next(e for e in events if e["event"] == "segment" and e["member"] == member
                       and e["segment"] == last["segment"])
        members.append((folder / segment["folder"], last["score"]))
    return members


def run_independent(args, seed: int, folder: Path, start=poor) -> tuple[list[tuple[Path, float]], float]:
    seeds = ",".join(str(100 * seed + i) for i in range(args.population))
    command = [sys.executable, "-m", "fiberrl", "-m", *fixed(args), *start(), f"seed={seeds}",
               f"hydra.sweep.dir={folder}", "hydra.sweep.subdir=member_${hydra.job.num}",
               f"hydra.launcher.runs_at_once={args.population}", "hydra.launcher.table=plain"]
    wall = _timed(command, folder.parent / f"{folder.name}.log")
    return independent_members(folder, args.population), wall


def independent_members(folder: Path, population: int) -> list[tuple[Path, float]]:
    members = []
    for member in range(population):
        run_dir = folder / f"member_{member}"
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        evals = [r["eval_reward"] for r in rows if isinstance(r.get("eval_reward"), (int, float))]
        members.append((run_dir, statistics.mean(evals[-WINDOW:])))
    return members


def run_ray(args, seed: int, folder: Path, synch: bool = False) -> tuple[list[tuple[Path, float]], float]:
    command = [args.ray_python, str(Path(__file__).with_name("pbt_ray_peer.py")), "--out", str(folder),
               "--seed", str(seed), "--population", str(args.population), "--interval", str(args.interval),
               "--quantile", str(QUANTILE), "--window", str(WINDOW), "--burn-in", str(args.burn_in)]
    command += [f"--set={o}" for o in fixed(args)] + [f"--start={o}" for o in poor()] + ["--synch"] * synch
    wall = _timed(command, folder.parent / f"{folder.name}.log")
    return ray_members(folder), wall


def ray_members(folder: Path) -> list[tuple[Path, float]]:
    result = json.loads((folder / "ray_results.json").read_text())
    failed = [t["error"] for t in result["trials"] if t["error"]]
    if failed:
        raise SystemExit(f"Ray's sweep in {folder}: {len(failed)} trials failed, the first: {failed[0]}")
    return [(Path(t["run_dir"]), t["score"]) for t in result["trials"]]


def _timed(command: list[str], log: Path) -> float:
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with open(log, "a") as fh:
        # a group of its own, so that a bench stopped mid-sweep stops the sweep too (Ray's daemons included)
        sweep = subprocess.Popen(command, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = sweep.wait()
        finally:
            if sweep.poll() is None:
                os.killpg(sweep.pid, signal.SIGTERM)
                sweep.wait()
    if returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])}... failed (exit {returncode}); its output: {log}")
    return time.perf_counter() - began


def evaluate_members(members: list[tuple[Path, float]], episodes: int, final_episodes: int = 0,
                     scored: dict | None = None) -> dict:
    """Every member's final policy on the same episodes. The best is the best by the ranking metric, or with
    ``final_episodes``, by the mean return of each final policy over that many other episodes (seeded
    FINAL_SEED + i: the PBT sweeper's final selection, done here alike for every sweep). ``scored``: a result
    of this function for the same members, whose scores are kept (only the best member is run again)."""
    from fiberrl.evaluate import evaluate

    def returns(folder: Path) -> list[float]:
        return [r for r, _ in evaluate(folder, episodes=episodes, seed=EVAL_SEED, which="latest")]
    if scored:
        finals = [[mean] for mean in scored["members_final"]]
    else:
        finals = [returns(folder) for folder, _ in members]
    by_ranking = max(range(len(members)), key=lambda i: members[i][1])
    selection = {}
    if final_episodes:
        began = time.perf_counter()
        chosen = [statistics.mean(r for r, _ in evaluate(folder, episodes=final_episodes, seed=FINAL_SEED,
                                                         which="latest")) for folder, _ in members]
        selection = {"selection_episodes": final_episodes, "members_selection": chosen,
                     "selection_s": time.perf_counter() - began,
                     "best_by_ranking": by_ranking, "best_by_ranking_final": statistics.mean(finals[by_ranking])}
        # ties: the lower index, as the sweeper names them
        best = min(range(len(members)), key=lambda i: (-chosen[i], i))
    else:
        best = by_ranking
    if scored:
        finals[best] = returns(members[best][0])
    return {**selection, "best_member": best, "best_dir": str(members[best][0]), "best_ranked_by": members[best][1],
            "best_final": statistics.mean(finals[best]), "best_final_std": statistics.pstdev(finals[best]),
            "episodes": len(finals[best]), "population_final": statistics.mean(map(statistics.mean, finals)),
            "members_final": [statistics.mean(f) for f in finals],
            "population_mean": statistics.mean(score for _, score in members),
            "members": [score for _, score in members]}


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # unwinds, so the running sweep is ended
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--member-steps", type=int, default=491_520)
    parser.add_argument("--interval", type=int, default=81_920)
    parser.add_argument("--which", nargs="+", default=["pbt", "independent", "ray"],
                        choices=[*PBT_KINDS, "independent", "preset", "ray", "ray-sync"])
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--burn-in", type=int, default=0,
                        help="env steps before a member may copy another, in both PBTs (Ray's burn_in_period)")
    parser.add_argument("--ray-python", default=sys.executable)
    parser.add_argument("--final-episodes", type=int, default=0,
                        help="name each sweep's best member by this many episodes of every final policy (the PBT "
                             "sweeper's hydra.sweeper.final_episodes; the same selection for the other sweeps); "
                             "0: by the ranking metric")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting added to every member of every sweep (algo.anneal_lr=false)")
    parser.add_argument("--start", action="append", default=[], metavar="KEY=VALUE",
                        help="a mutated setting's poor start for every sweep, in place of the default above "
                             "(algo.learning_rate=1e-2)")
    parser.add_argument("--reselect", action="store_true",
                        help="no sweep is run: the best member of each sweep in OUT/results.json whose folder is "
                             "still there is named again by --final-episodes")
    args = parser.parse_args()
    set_poor(args.start)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    kinds = {"pbt": run_pbt, "pbt-ttest": functools.partial(run_pbt, selection="ttest"),
             "pbt-ready": functools.partial(run_pbt, ranking="ready"),
             "pbt-sync": functools.partial(run_pbt, synchronous=True),
             "pbt-ttest-sync": functools.partial(run_pbt, selection="ttest", synchronous=True),
             "pbt-pb2": functools.partial(run_pbt, explore="pb2"),
             "pbt-pb2-sync": functools.partial(run_pbt, synchronous=True, explore="pb2"),
             "independent": run_independent, "preset": functools.partial(run_independent, start=list),
             "ray": run_ray, "ray-sync": functools.partial(run_ray, synch=True)}
    if args.reselect:
        reselect(results, args)
        results_path.write_text(json.dumps(results, indent=1))
        report(results, args)
        return
    if {"ray", "ray-sync"} & set(args.which) and (why := missing_imports(args.ray_python, ["ray.tune", "fiberrl"])):
        print(f"the Ray peer is skipped: {why}", flush=True)
        args.which = [k for k in args.which if not k.startswith("ray")]
    for seed in args.seeds:
        for kind in args.which:
            key = f"{kind}/seed{seed}"
            if key in results:
                continue
            print(f"{key}: running", flush=True)
            members, wall = kinds[kind](args, seed, args.out / kind / f"seed{seed}")
            result = evaluate_members(members, args.eval_episodes, args.final_episodes)
            if args.final_episodes and not kind.startswith("pbt"):
                # the PBT sweeper's wall time holds its own final selection: the others' hold the same made here
                wall += result["selection_s"]
            results[key] = dict(result, wall_s=wall, conditions=conditions(args))
            if kind.startswith("pbt") and args.final_episodes:
                results[key]["sweeper_named"] = named_by_sweeper(args.out / kind / f"seed{seed}")
            results_path.write_text(json.dumps(results, indent=1))
            r = results[key]
            print(f"{key}: best {r['best_final']:.1f} over {r['episodes']} episodes, population "
                  f"{r['population_final']:.1f} (ranking metric {r['population_mean']:.1f}), {wall / 60:.1f} min",
                  flush=True)
    report(results, args)


def conditions(args) -> dict:
    """What a sweep ran under: runs repeat exactly on one machine, not across machines (the same member's
    first evaluations differ), so only sweeps of the same machine and settings compare."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "") if Path("/proc/cpuinfo").exists() else ""
    return {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "population": args.population,
            "member_steps": args.member_steps, "interval": args.interval, "burn_in": args.burn_in,
            "final_episodes": args.final_episodes, "set": args.set, "start": poor()}


def named_by_sweeper(folder: Path) -> int | None:
    """The member the PBT sweeper's final selection named: the best mean of its "final" records."""
    events = [json.loads(line) for line in (folder / "pbt.jsonl").read_text().splitlines() if line.strip()]
    finals = [(-e["mean"], e["member"]) for e in events if e["event"] == "final" and "mean" in e]
    return min(finals)[1] if finals else None


def reselect(results: dict, args) -> None:
    """Each sweep of ``results`` whose members' folders are still there, its best named again by ``--final-episodes``
    episodes of every final policy; its wall time and its members' scores kept."""
    if not args.final_episodes:
        raise SystemExit("--reselect names the best by --final-episodes episodes: give --final-episodes N")
    readers = {**{kind: lambda f: pbt_members(f, args.population) for kind in PBT_KINDS},
               "independent": lambda f: independent_members(f, args.population),
               "preset": lambda f: independent_members(f, args.population), "ray": ray_members,
               "ray-sync": ray_members}
    for key, result in sorted(results.items()):
        kind, seed = key.split("/")
        try:
            members = readers[kind](args.out / kind / seed)
        except FileNotFoundError as exc:
            print(f"{key}: left as it was, its folders are gone ({exc.filename})", flush=True)
            continue
        if any(not folder.is_dir() for folder, _ in members):
            print(f"{key}: left as it was, a member's folder is gone", flush=True)
            continue
        results[key] = dict(evaluate_members(members, args.eval_episodes, args.final_episodes, scored=result),
                            wall_s=result["wall_s"])
        r = results[key]
        print(f"{key}: best by the final selection member {r['best_member']} ({r['best_final']:.1f}), by the "
              f"ranking member {r['best_by_ranking']} ({r['best_by_ranking_final']:.1f})", flush=True)


def report(results: dict, args) -> None:
    print(f"\nPPO on BipedalWalker-v3, {args.population} members x {args.member_steps:,} env steps, from poor "
          f"starting values ({', '.join(poor())}); each member's final policy over {args.eval_episodes} episodes")
    print(f"{'sweep':<22}{'best member':>14}{'population mean':>18}{'ranking metric':>16}{'wall (min)':>12}")
    for key, r in sorted(results.items()):
        population = r.get("population_final", float("nan"))  # results written before every member was scored
        print(f"{key:<22}{r['best_final']:>14.1f}{population:>18.1f}{r['population_mean']:>16.1f}"
              f"{r['wall_s'] / 60:>12.1f}")
    for key, r in sorted(results.items()):
        if "members_selection" in r:
            print(f"{key}: best named by {r['selection_episodes']} episodes of each final policy: member "
                  f"{r['best_member']} ({r['best_final']:.1f}); by the ranking metric: member {r['best_by_ranking']} "
                  f"({r['best_by_ranking_final']:.1f})" + (f"; the sweeper named member {r['sweeper_named']}"
                                                           if "sweeper_named" in r else ""))
    for ours, kind in [(o, k) for o in PBT_KINDS for k in ("independent", "ray", "ray-sync")]:
        pairs = [(results[f"{ours}/seed{s}"], results[f"{kind}/seed{s}"]) for s in args.seeds
                 if f"{ours}/seed{s}" in results and f"{kind}/seed{s}" in results]
        if pairs:
            better = statistics.mean(a["best_final"] - b["best_final"] for a, b in pairs)
            population = statistics.mean(a.get("population_final", float("nan")) - b.get("population_final",
                                         float("nan")) for a, b in pairs)
            print(f"{ours} vs {kind}: best member {better:+.1f}, population {population:+.1f}, "
                  f"wall time {statistics.mean(a['wall_s'] / b['wall_s'] for a, b in pairs):.2f}x")


if __name__ == "__main__":
    main()
