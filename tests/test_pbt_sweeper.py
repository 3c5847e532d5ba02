"""``hydra/sweeper=pbt`` as users meet it: the pause and retuned resume it stands on, its choices, small ES
and PPO populations (generational ones reproduced, asynchronous ones resumed after the sweep is killed,
a member's job killed, a checkpoint damaged), its lineage and plot, and each bad input in one line."""
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import PYTHON, ROOT, wait_until
from helpers.script_runs import run_sweep
from helpers.small_runs import SMALL_PPO, small_es
from hydra_plugins.fiberrl_launcher.run_in_job import RETURN_FILE

# this file's own seed and noise table size (helpers/small_runs.py)
ES = ["-m", "fiberrl", "-m", "hydra/sweeper=pbt", "algo=es", *small_es(43, 250_043), "algo.iterations=6",
      "hydra.launcher.table=off"]
# three members, the bottom one copying the top one each time it is ready
SMALL_POPULATION = ["hydra.sweeper.population=3", "hydra.sweeper.quantile=0.34", "hydra.sweeper.interval=600"]


def sweep(args, timeout=300, wait=True):
    return run_sweep(args, ROOT, timeout=timeout, wait=wait)


def lineage(sweep_dir: Path, kind: str | None = None) -> list[dict]:
    events = [json.loads(line) for line in (sweep_dir / "pbt.jsonl").read_text().splitlines() if line.strip()]
    return [e for e in events if kind is None or e["event"] == kind]


def decisions(sweep_dir: Path) -> list[str]:
    """The lineage without its clock, nor the order in which runs that went at the same time ended."""
    return sorted(json.dumps({k: v for k, v in e.items() if k not in ("time", "elapsed_s")}, sort_keys=True)
                  for e in lineage(sweep_dir) if e["event"] in ("segment", "exploit", "ended"))


def last_theta(sweep_dir: Path, member: int) -> np.ndarray:
    segment = sorted((sweep_dir / f"member_{member}").glob("segment_*"))[-1]
    checkpoint = sorted((segment / "checkpoints").glob("*.npz"))[-1]
    with np.load(checkpoint) as data:
        return data["theta"]


def deciding_sweeper(sweep_dir: Path, window: int, population: int = 2, **settings):
    """A sweeper that makes its decisions alone: the segments it would start are collected, not run."""
    from hydra_plugins.fiberrl_pbt.sweeper import PBTSweeper
    sweeper = PBTSweeper(population=population, interval=100, burn_in=0, metric="eval_reward", mode="max",
                         window=window, quantile=0.5, params={}, resample_probability=0.25, perturb_factors=[0.8, 1.2],
                         sample_initial=False, synchronous=False, seed=0, **settings)
    sweeper.sweep_dir, sweeper.mutations, sweeper.decision_seed, sweeper._started = sweep_dir, [], 0, 0.0
    launched = []
    sweeper._launch = launched.append
    return sweeper, launched


# --- what PBT stands on: a run pauses at until_timesteps, and a resume may retune ----------------------

@pytest.mark.slow
def test_a_paused_run_goes_on_as_if_never_paused_and_a_resume_may_retune_only_what_is_tunable(tmp_path):
    base = ["-m", "fiberrl", "algo=es", *small_es(43, 250_043), "algo.iterations=4"]
    run = lambda *args: subprocess.run([PYTHON, *base, *args], cwd=ROOT, text=True, capture_output=True)  # noqa: E731
    whole, paused = tmp_path / "whole", tmp_path / "paused"
    assert run(f"hydra.run.dir={whole}").returncode == 0
    out = run(f"hydra.run.dir={paused}", "until_timesteps=300")
    assert out.returncode == 0 and "paused at" in out.stdout, out.stderr
    assert len((paused / "metrics.jsonl").read_text().splitlines()) < 4
    assert run(f"resume={paused}").returncode == 0
    rows = lambda d: [{k: v for k, v in json.loads(x).items()  # noqa: E731
                       if not k.endswith("_s") and k != "wall_time"}
                      for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows(paused) == rows(whole)

    # a tunable setting may change on resume, said in a line; any other is refused as before
    retuned = tmp_path / "retuned"
    assert run(f"hydra.run.dir={retuned}", "until_timesteps=300").returncode == 0
    out = run(f"resume={retuned}", "algo.sigma=0.03")
    assert out.returncode == 0 and "with algo.sigma=0.03 (it ran with 0.02)" in out.stdout, out.stdout + out.stderr
    out = run(f"resume={retuned}", "algo.population=6")
    assert out.returncode == 2 and "algo.population=4 there, 6 here" in out.stderr, out.stderr


# --- its choices, without processes ------------------------------------------------------------------

def test_mutations_perturb_within_their_space_and_resample_from_it():
    from hydra_plugins.fiberrl_pbt.mutations import MutationError, parse
    rng = np.random.default_rng(0)
    lr = parse("algo.learning_rate", "tag(log, interval(1e-5, 1e-2))", 0.25, [0.8, 1.2], integer=False)
    assert lr.log and (lr.low, lr.high) == (1e-5, 1e-2)
    seen = {lr.explore(1e-3, rng) for _ in range(200)}
    assert {8e-4, 1.2e-3} <= seen and all(1e-5 <= v <= 1e-2 for v in seen) and len(seen) > 2  # resampled too
    assert lr.explore(1e-2, np.random.default_rng(1)) <= 1e-2
    never = parse("algo.clip_coef", {"space": "interval(0.1, 0.3)", "resample": 0.0, "factors": [0.5, 2.0]},
                  0.25, [0.8, 1.2], integer=False)
    assert {never.explore(0.2, rng) for _ in range(50)} == {0.1, 0.3}
    lam = parse("algo.gae_lambda", "choice(0.9, 0.95, 0.99)", 0.0, [0.8, 1.2], integer=False)
    assert {lam.explore(0.95, rng) for _ in range(50)} == {0.9, 0.99}
    epochs = parse("algo.update_epochs", "interval(2, 20)", 0.0, [1.2], integer=True)
    assert epochs.explore(10, rng) == 12
    # a perturbation always moves: at a range's edge the way left, a 0 no factor moves is resampled
    lam = parse("algo.gae_lambda", "interval(0.8, 1.0)", 0.0, [0.8, 1.2], integer=False)
    assert {lam.explore(0.8, rng) for _ in range(50)} == {0.96}
    assert {lam.explore(1.0, rng) for _ in range(50)} == {0.8}
    ent = parse("algo.ent_coef", "interval(0, 0.05)", 0.0, [0.8, 1.2], integer=False)
    assert len({ent.explore(0.0, rng) for _ in range(50)} - {0.0}) == 50
    epochs = parse("algo.update_epochs", "interval(1, 20)", 0.0, [0.8, 1.2], integer=True)
    assert {epochs.explore(2, rng) for _ in range(50)} == {1, 3} and {epochs.explore(1, rng) for _ in range(50)} == {2}
    gamma = parse("algo.gamma", "choice(0.9, 0.95, 0.99)", 0.0, [0.8, 1.2], integer=False)
    assert {gamma.explore(0.99, rng) for _ in range(50)} == {0.95}
    for spec, said in [("interval(0.5, 0.1)", "an empty range"), ("tag(log, interval(0, 1))", "above 0"),
                       ("0.3", "one value is no space"), ("range(5, 5)", "an empty range"),
                       ("interval(0.1", "not a space in Hydra's sweep syntax")]:
        with pytest.raises(MutationError, match=said):
            parse("algo.sigma", spec, 0.25, [0.8, 1.2], integer=False)


def test_a_member_in_the_bottom_quantile_copies_one_in_the_top_quantile():
    from hydra_plugins.fiberrl_pbt.population import Member, Segment, choose_donor, quantile_size
    members = []
    for index, score in enumerate([10.0, 50.0, 30.0, 40.0, 20.0, 60.0, 0.0, 70.0]):
        segment = Segment(index, 0, index, Path("x"), index, {}, 100, state="ended", values=[score],
                          checkpoint="c.npz", paused=True)
        members.append(Member(index, [segment]))
    standings = {m.index: m.standing(1) for m in members}
    assert quantile_size(8, 0.25) == 2 and quantile_size(3, 0.5) == 1 and quantile_size(2, 0.25) == 1
    rng = np.random.default_rng(0)
    assert {choose_donor(6, standings, True, 0.25, rng) for _ in range(40)} == {5, 7}
    assert choose_donor(2, standings, True, 0.25, rng) is None  # the middle goes on
    assert choose_donor(7, standings, True, 0.25, rng) is None
    assert choose_donor(7, standings, True, 0.25, rng, must=True) == 5  # damaged: the best other
    assert {choose_donor(7, standings, False, 0.25, rng) for _ in range(40)} == {6, 0}  # min
    assert choose_donor(6, standings, True, 0.25, rng, passed_over=frozenset({5})) == 7

    # a running member is ranked by what it has logged so far, and copied from where its segment began
    running = Segment(0, 1, 8, Path("y"), 0, {"a": 1}, 200, start_from="member_5/segment_000/c.npz",
                      start_timesteps=100, carried=[60.0], values=[80.0, 90.0])
    members[0].segments.append(running)
    standing = members[0].standing(2)
    assert standing.score == 85.0 and standing.checkpoint == "member_5/segment_000/c.npz"
    assert standing.timesteps == 100 and standing.history == [60.0]
    first = Member(9, [Segment(9, 0, 9, Path("z"), 9, {}, 100, values=[5.0])])
    assert first.standing(3).score == 5.0 and first.standing(3).checkpoint is None  # nothing to copy yet


def test_a_copy_ranks_at_its_own_score_until_it_logs_one_so_a_round_replaces_only_the_bottom_quantile():
    """Four members, the bottom quarter copying the top: seed 1 of the BipedalWalker bench ranked a copy at
    its donor's score, so at one round of ready points all four copied in turn (member 3 the copy of its own
    older checkpoint). Ranked at its own score until it logs a value, the copy is the bottom, and
    the next ready member, above it, goes on from its own."""
    from hydra_plugins.fiberrl_pbt.population import Member, Segment, choose_donor

    def ended(index: int, score: float) -> Segment:
        return Segment(index, 0, index, Path(f"m{index}"), index, {}, 100, state="ended", timesteps=100,
                       values=[score], checkpoint=f"member_{index}/c.npz", paused=True)

    members = [Member(i, [ended(i, score)]) for i, score in enumerate([-63.7, -49.5, -79.6, -47.1])]
    rng = np.random.default_rng(0)
    standings = {m.index: m.standing(3) for m in members}
    assert choose_donor(2, standings, True, 0.25, rng) == 3  # member 2, the bottom, copies member 3
    copy = Segment(2, 1, 4, Path("m2s1"), 3, {}, 200, start_from="member_3/c.npz", start_timesteps=100,
                   carried=[-47.1], stands_at=-79.6)
    members[2].segments.append(copy)
    standings = {m.index: m.standing(3) for m in members}
    assert standings[2].score == -79.6 and standings[2].checkpoint == "member_3/c.npz"
    assert choose_donor(0, standings, True, 0.25, rng) is None  # member 0, ready next, is not the bottom
    copy.values = [-40.0]  # once it logs, its lineage's window ranks it
    assert members[2].standing(3).score == (-47.1 - 40.0) / 2
    assert choose_donor(0, {m.index: m.standing(3) for m in members}, True, 0.25, rng) == 2  # now it is


def test_a_ready_member_copies_a_running_donors_newest_checkpoint(tmp_path):
    """Members that run in step are ready at about the same time: what a running top member has to give is
    the newest checkpoint its segment has written, with the metric as logged up to it, not the point its
    segment began from (the ready member's own start, which it may not copy)."""
    from fiberrl.run import save_npz
    from hydra_plugins.fiberrl_pbt.population import Member, Segment

    def checkpoint(folder: str, iteration: int, timesteps: int) -> str:
        path = tmp_path / folder / "checkpoints" / f"{iteration:06d}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(path, {"theta": np.full(3, float(timesteps))}, {"timesteps": timesteps, "format": 2})
        return str(path.relative_to(tmp_path))

    sweeper, launched = deciding_sweeper(tmp_path, window=2)
    ready = Segment(0, 0, 0, tmp_path / "member_0/segment_000", 0, {}, 100, state="ended", timesteps=100,
                    values=[-5.0], checkpoint=checkpoint("member_0/segment_000", 1, 100), paused=True)
    running = Segment(1, 0, 1, tmp_path / "member_1/segment_000", 1, {}, 100)
    checkpoint("member_1/segment_000", 0, 50)
    (running.folder / "metrics.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in [{"iteration": 0, "timesteps": 50, "eval_reward": 10.0},
                                                     {"iteration": 1, "timesteps": 75, "eval_reward": 20.0}]))
    sweeper.members = [Member(0, [ready]), Member(1, [running])]

    sweeper._go_on(sweeper.members[0])
    went_on = launched[0]
    # recorded under a name of its own in the donor's folder, which the donor's run does not drop
    assert went_on.start_from == "member_1/segment_000/copied/000000.npz" and went_on.start_timesteps == 50
    (running.folder / "checkpoints" / "000000.npz").unlink()
    assert (tmp_path / went_on.start_from).exists()
    assert went_on.until == 150 and went_on.seed == 1
    assert went_on.carried == [10.0]  # what the donor had logged up to its checkpoint, not after it
    assert went_on.stands_at == -5.0  # ranked at its own score until it logs one
    assert lineage(tmp_path, "segment")[-1]["stands_at"] == -5.0  # and so after a resume
    with np.load(went_on.folder / "checkpoints" / "000000.npz") as data:
        assert data["theta"][0] == 50.0
    exploit = lineage(tmp_path, "exploit")[0]
    assert (exploit["from"], exploit["to"], exploit["from_timesteps"], exploit["from_score"]) == (1, 0, 50, 15.0)


def test_a_member_that_has_finished_is_not_copied_for_it_leaves_no_steps_to_explore(tmp_path):
    """Seed 1 of the BipedalWalker bench: member 2, ready at its last point, copied member 0's final checkpoint
    and ended on it with nothing run, a second copy of member 0 in the population's mean. A finished member
    still ranks the others but is not copied; one that has only paused is."""
    from fiberrl.run import save_npz
    from hydra_plugins.fiberrl_pbt.population import Member, Segment

    def ended(sweep_dir: Path, member: int, score: float, timesteps: int, paused: bool) -> Segment:
        folder = sweep_dir / f"member_{member}/segment_000"
        path = folder / "checkpoints" / "000001.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(path, {"theta": np.full(3, float(member))}, {"timesteps": timesteps, "format": 2})
        return Segment(member, 0, member, folder, member, {}, timesteps, state="ended", timesteps=timesteps,
                       values=[score], checkpoint=str(path.relative_to(sweep_dir)), paused=paused)

    for leader_paused, copies in [(False, False), (True, True)]:
        sweep_dir = tmp_path / f"leader_paused_{leader_paused}"
        sweeper, launched = deciding_sweeper(sweep_dir, window=1)
        sweeper.members = [Member(0, [ended(sweep_dir, 0, -5.0, 100, paused=True)]),
                           Member(1, [ended(sweep_dir, 1, 10.0, 200, paused=leader_paused)])]
        sweeper._go_on(sweeper.members[0])
        went_on = launched[0]
        assert bool(lineage(sweep_dir, "exploit")) == copies
        assert went_on.start_from == ("member_1" if copies else "member_0") + "/segment_000/checkpoints/000001.npz"
        assert went_on.start_timesteps == (200 if copies else 100)


def test_ranking_at_ready_points_copies_a_donor_only_from_where_it_ranked_on_top(tmp_path):
    """``ranking=ready``, Ray Tune's rules: members are ranked as they stood at their own last ready points, and
    a bottom member copies a top one only from a ready point at which that one ranked in the top quantile. The
    first member ready past the burn-in is ranked alone and keeps no checkpoint for others to take, where ranked
    as they are now the others' latest values already rank it (whether that spares a late starter depends on
    which members are ready first: in seed 0 of the constant-rate bench it did under Ray, not under fiberrl)."""
    from fiberrl.run import save_npz
    from hydra_plugins.fiberrl_pbt.population import Member, Segment

    def segment(sweep_dir: Path, member: int, index: int, timesteps: int, value: float) -> Segment:
        folder = sweep_dir / f"member_{member}/segment_{index:03d}"
        path = folder / "checkpoints" / f"{timesteps:06d}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(path, {"theta": np.full(3, float(member))}, {"timesteps": timesteps, "format": 2})
        (folder / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "timesteps": timesteps, "eval_reward": value})
                                              + "\n")
        return Segment(member, index, member + 10 * index, folder, member, {}, timesteps, values=[value],
                       checkpoint=str(path.relative_to(sweep_dir)), timesteps=timesteps, paused=True, state="ended")

    def runs_on(sweep_dir: Path, ready: Segment, value: float, ranked_top: bool = False) -> Segment:
        """On since its ready point, with a newer checkpoint and a better value than it had there."""
        newer = segment(sweep_dir, ready.member, ready.index + 1, ready.timesteps + 50, value)
        newer.state, newer.start_timesteps, newer.start_from = "running", ready.timesteps, ready.checkpoint
        newer.ranked_top = ranked_top
        return newer

    def population(ranking: str):
        """Member 0 ready first at the burn-in (100) at -5 and running on, member 1 ready now at -10, members 2
        and 3 still in their first segments, ahead of both as they are now."""
        sweep_dir = tmp_path / ranking
        sweeper, launched = deciding_sweeper(sweep_dir, window=1, population=4, ranking=ranking)
        sweeper.quantile, sweeper.burn_in = 0.25, 100
        first = segment(sweep_dir, 0, 0, 100, -5.0)
        sweeper.members = [Member(0, [first, runs_on(sweep_dir, first, 40.0)]),
                           Member(1, [segment(sweep_dir, 1, 0, 100, -10.0)])]
        for member, value in [(2, 50.0), (3, 60.0)]:
            started = segment(sweep_dir, member, 0, 60, value)
            started.state = "running"
            sweeper.members.append(Member(member, [started]))
        return sweep_dir, sweeper, launched

    # as they are now, member 1 is the bottom of four and copies member 3's newest checkpoint
    sweep_dir, sweeper, launched = population("now")
    sweeper._go_on(sweeper.members[1])
    assert launched[-1].start_from.startswith("member_3/segment_000/")
    # at their ready points only members 0 and 1 are ranked: member 1 is the bottom, but member 0 ranked alone at
    # its own and kept no checkpoint, so the exploit is skipped and member 1 goes on from its own
    sweep_dir, sweeper, launched = population("ready")
    sweeper._go_on(sweeper.members[1])
    assert not lineage(sweep_dir, "exploit")
    assert launched[-1].start_from == sweeper.members[1].segments[0].checkpoint and not launched[-1].ranked_top
    assert lineage(sweep_dir, "segment")[-1]["ranked_top"] is False
    # member 3 is ready at 100 with 30, the best at the ready points: it keeps that point's checkpoint
    member_3 = sweeper.members[3]
    member_3.segments = [segment(sweep_dir, 3, 0, 100, 30.0)]
    sweeper._go_on(member_3)
    assert launched[-1].ranked_top and lineage(sweep_dir, "segment")[-1]["ranked_top"] is True
    # and runs on from it; member 2, ready at 100 with -20, the bottom of four, copies member 3 from that ready
    # point's checkpoint, not the newer one its running segment has written, and runs to the donor's next
    member_3.segments[-1] = runs_on(sweep_dir, member_3.segments[0], 99.0, ranked_top=True)
    sweeper.members[2].segments = [segment(sweep_dir, 2, 0, 100, -20.0)]
    sweeper._go_on(sweeper.members[2])
    exploit = lineage(sweep_dir, "exploit")[-1]
    assert (exploit["from"], exploit["to"], exploit["from_score"]) == (3, 2, 30.0)
    assert launched[-1].start_from == "member_3/segment_000/checkpoints/000100.npz"
    assert launched[-1].until == 200 and not launched[-1].ranked_top
    # a copy ranks at its own score there until its next ready point (Ray Tune keeps a trial's last score), and
    # that old checkpoint is not one to copy
    standing = sweeper.members[2].ready_standing(1, 100)
    assert standing.score == -20.0 and not standing.kept


def test_ranking_at_ready_points_lets_the_member_ready_first_copy_the_point_its_own_segment_began_at(tmp_path):
    """Seed 2 of the constant-rate bench under Ray's rules: member 2 walked worst, so its evaluation episodes
    ended soonest and it was ready first at every point past the burn-in, when the others still stood at the
    ready point its own segment had begun at. Kept from copying a point not past its own start, it went on from
    its own checkpoint at 409,600 steps, the bottom of four, as member 0 did at 737,280: no exploit in 737,280
    steps. Ray Tune copies a top member's kept checkpoint wherever it stands, the copy running those env steps
    again; so does ``ranking=ready``. Ranked as they are now, the guard holds: each exploit moves a member
    forward."""
    from fiberrl.run import save_npz
    from hydra_plugins.fiberrl_pbt.population import Member, Segment

    def ended(sweep_dir: Path, member: int, index: int, value: float) -> Segment:
        folder = sweep_dir / f"member_{member}/segment_{index:03d}"
        timesteps = 100 * (index + 1)
        path = folder / "checkpoints" / f"{timesteps:06d}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(path, {"theta": np.full(3, float(member))}, {"timesteps": timesteps, "format": 2})
        (folder / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "timesteps": timesteps, "eval_reward": value})
                                              + "\n")
        previous = f"member_{member}/segment_{index - 1:03d}/checkpoints/{timesteps - 100:06d}.npz" if index else None
        return Segment(member, index, member + 10 * index, folder, member, {}, timesteps, start_from=previous,
                       start_timesteps=timesteps - 100, values=[value], checkpoint=str(path.relative_to(sweep_dir)),
                       timesteps=timesteps, paused=True, state="ended")

    def population(ranking: str):
        """Members 0, 1 and 3 ranked at 100 (3 on top, so it kept that point) and running on from it; member 2,
        which began its second segment at 100 too, ready first at 200 and still the worst."""
        sweep_dir = tmp_path / ranking
        sweeper, launched = deciding_sweeper(sweep_dir, window=1, population=4, ranking=ranking)
        sweeper.quantile, sweeper.burn_in = 0.25, 100
        sweeper.members = []
        for member, value in enumerate([-60.0, -40.0, -90.0, 20.0]):
            first = ended(sweep_dir, member, 0, value)
            if member == 2:
                sweeper.members.append(Member(2, [first, ended(sweep_dir, 2, 1, -120.0)]))
                continue
            on = Segment(member, 1, member + 10, sweep_dir / f"member_{member}/segment_001", member, {}, 200,
                         start_from=first.checkpoint, start_timesteps=100, ranked_top=member == 3)
            sweeper.members.append(Member(member, [first, on]))
        return sweep_dir, sweeper, launched

    sweep_dir, sweeper, launched = population("ready")
    sweeper._go_on(sweeper.members[2])
    exploit = lineage(sweep_dir, "exploit")[-1]
    assert (exploit["from"], exploit["to"], exploit["from_timesteps"], exploit["timesteps"]) == (3, 2, 100, 200)
    assert launched[-1].start_from == "member_3/segment_000/checkpoints/000100.npz"
    assert launched[-1].start_timesteps == 100 and launched[-1].until == 200

    # ranked as they are now, the others' checkpoints stand where member 2's segment began: it goes on alone
    sweep_dir, sweeper, launched = population("now")
    sweeper._go_on(sweeper.members[2])
    assert not lineage(sweep_dir, "exploit")
    assert launched[-1].start_from == "member_2/segment_001/checkpoints/000200.npz"


def test_ttest_selection_copies_only_a_member_whose_values_are_significantly_better():
    """Jaderberg et al.'s t-test selection: another member drawn at random is copied when Welch's t-test on the
    two members' last values finds it better; a difference as large but as noisy as BipedalWalker's 3-episode
    evaluations early on is not, where truncation copies whatever ranks on top."""
    from hydra_plugins.fiberrl_pbt.population import (Member, Segment, choose_donor, choose_donor_by_ttest,
                                                      welch_p_value)

    def standings(*histories):
        members = [Member(i, [Segment(i, 0, i, Path(f"m{i}"), i, {}, 100, state="ended", timesteps=100,
                                      values=list(values), checkpoint=f"member_{i}/c.npz", paused=True)])
                   for i, values in enumerate(histories)]
        return {m.index: m.standing(3) for m in members}

    rng = np.random.default_rng(0)
    # a member that falls at once, steadily, against one that walks
    steady = standings([-106.2, -109.0, -104.3], [150.2, 171.9, 160.4])
    donor, p_value = choose_donor_by_ttest(0, steady, True, 0.05, rng)
    assert donor == 1 and p_value < 0.001
    assert choose_donor_by_ttest(1, steady, True, 0.05, rng) == (None, pytest.approx(1.0, abs=1e-3))
    assert choose_donor_by_ttest(1, steady, False, 0.05, rng)[0] == 0  # min: the lower is better
    # a late starter 40 below the leader on noisy evaluations: truncation copies over it, the t-test does not
    noisy = standings([60.3, 141.0, 171.1], [172.0, 183.9, 176.3])
    assert choose_donor(0, noisy, True, 0.5, rng) == 1
    donor, p_value = choose_donor_by_ttest(0, noisy, True, 0.05, rng)
    assert donor is None and 0.05 < p_value < 0.5
    # the one-sided Welch's test: t = 1.549 on 2.94 degrees of freedom, whose Student-t tail (integrated
    # numerically, apart from scipy) is 0.11044
    assert welch_p_value([2.0, 4.0, 6.0], [1.0, 2.0, 3.0], True) == pytest.approx(0.11044, abs=1e-5)
    assert welch_p_value([5.0, 5.0], [1.0, 1.0], True) == 0.0 and welch_p_value([1.0, 1.0], [1.0, 1.0], True) == 1.0
    # fewer than two values: no variance, no test, no copy
    assert choose_donor_by_ttest(0, standings([-100.0], [150.0, 160.0]), True, 0.05, rng) == (None, None)
    # the member drawn is any other with something to copy, uniformly
    three = standings([0.0, 1.0, 0.5], [100.0, 101.0, 99.0], [100.0, 102.0, 98.0])
    assert {choose_donor_by_ttest(0, three, True, 0.05, rng)[0] for _ in range(40)} == {1, 2}
    assert {choose_donor_by_ttest(0, three, True, 0.05, rng, passed_over=frozenset({1}))[0]
            for _ in range(10)} == {2}


def test_a_ttest_exploit_records_its_p_value_and_the_values_it_compared(tmp_path):
    from fiberrl.run import save_npz
    from hydra_plugins.fiberrl_pbt.population import Member, Segment

    def ended(member: int, values: list) -> Segment:
        folder = tmp_path / f"member_{member}/segment_000"
        path = folder / "checkpoints" / "000001.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(path, {"theta": np.full(3, float(member))}, {"timesteps": 100, "format": 2})
        return Segment(member, 0, member, folder, member, {}, 100, state="ended", timesteps=100, values=values,
                       checkpoint=str(path.relative_to(tmp_path)), paused=True)

    sweeper, launched = deciding_sweeper(tmp_path, window=3, selection="ttest", significance=0.05)
    sweeper.members = [Member(0, [ended(0, [-106.2, -109.0, -104.3])]), Member(1, [ended(1, [150.2, 171.9, 160.4])])]
    sweeper._go_on(sweeper.members[0])
    exploit = lineage(tmp_path, "exploit")[0]
    assert (exploit["from"], exploit["to"]) == (1, 0) and exploit["p_value"] < 0.001
    assert exploit["from_values"] == [150.2, 171.9, 160.4] and exploit["to_values"] == [-106.2, -109.0, -104.3]
    assert launched[0].start_from == "member_1/segment_000/checkpoints/000001.npz"
    # the leader, ready next, draws member 0 (now a copy of it) and is not significantly worse: it goes on
    sweeper._go_on(sweeper.members[1])
    assert len(lineage(tmp_path, "exploit")) == 1 and launched[1].start_from.startswith("member_1/")


def test_a_ttest_exploit_of_a_fresh_copy_records_the_score_of_the_values_it_compared(tmp_path):
    """A member that has just copied another and not yet logged a value is ranked (by truncation) at its own old
    score, but what the t-test compares, and a member copying it takes, is its donor's: the record's from_score
    is the mean of those values, not the old score."""
    from fiberrl.run import save_npz
    from hydra_plugins.fiberrl_pbt.population import Member, Segment

    leader = tmp_path / "member_2/segment_000/checkpoints/000001.npz"
    leader.parent.mkdir(parents=True)
    save_npz(leader, {"theta": np.full(3, 2.0)}, {"timesteps": 100, "format": 2})
    poor = tmp_path / "member_0/segment_000/checkpoints/000001.npz"
    poor.parent.mkdir(parents=True)
    save_npz(poor, {"theta": np.zeros(3)}, {"timesteps": 100, "format": 2})
    ready = Segment(0, 0, 0, poor.parents[1], 0, {}, 100, state="ended", timesteps=100,
                    values=[-106.2, -109.0, -104.3], checkpoint=str(poor.relative_to(tmp_path)), paused=True)
    fresh_copy = Segment(1, 1, 3, tmp_path / "member_1/segment_001", 2, {}, 200, start_from=str(leader.relative_to(
        tmp_path)), start_timesteps=100, carried=[150.2, 171.9, 160.4], stands_at=-120.0)
    gone = Segment(2, 0, 2, leader.parents[1], 2, {}, 100, state="failed")
    sweeper, launched = deciding_sweeper(tmp_path, window=3, population=3, selection="ttest", significance=0.05)
    sweeper.members = [Member(0, [ready]), Member(1, [fresh_copy]), Member(2, [gone])]
    sweeper._go_on(sweeper.members[0])
    exploit = lineage(tmp_path, "exploit")[0]
    assert (exploit["from"], exploit["to"]) == (1, 0) and exploit["from_values"] == [150.2, 171.9, 160.4]
    assert exploit["from_score"] == pytest.approx(sum(exploit["from_values"]) / 3)
    assert exploit["to_score"] == pytest.approx(sum(exploit["to_values"]) / 3)
    assert launched[0].start_from == str(leader.relative_to(tmp_path))


# --- sweeps -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_generational_sweep_gives_the_same_lineage_and_parameters_again_and_draws_them(tmp_path):
    args = [*ES, *SMALL_POPULATION, "hydra.sweeper.synchronous=true"]
    code, out, err = sweep([*args, f"hydra.sweep.dir={tmp_path / 'a'}"])
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("pbt: 3 members, ready every 600 env steps, generational; ranked by eval_reward"), first
    assert "mutating algo.sigma in log [0.002, 0.5], algo.learning_rate in log [0.0001, 0.2] (algo=es's usual set)" \
        in first
    assert "best member" in out and "plot it:     python -m fiberrl.plot" in out
    code, _, err = sweep([*args, f"hydra.sweep.dir={tmp_path / 'b'}"])
    assert code == 0, err
    assert lineage(tmp_path / "a", "exploit"), "no member copied another"
    assert decisions(tmp_path / "a") == decisions(tmp_path / "b")
    for member in range(3):
        assert np.array_equal(last_theta(tmp_path / "a", member), last_theta(tmp_path / "b", member))

    # an exploit is recorded whole, and the member went on from the donor's checkpoint: its counters, its
    # settings explored
    exploit = lineage(tmp_path / "a", "exploit")[0]
    assert {"time", "timesteps", "from", "to", "old", "new", "from_score", "to_score"} <= exploit.keys()
    copy = next(e for e in lineage(tmp_path / "a", "segment") if e["start_from"] == exploit["checkpoint"]
                and e["member"] == exploit["to"])
    assert copy["settings"] == exploit["new"] and copy["until"] == exploit["from_timesteps"] + 600
    assert exploit["checkpoint"].startswith(f"member_{exploit['from']}/")
    log = (tmp_path / "a" / copy["folder"] / "output.log").read_text()
    assert f"after iteration {int(Path(exploit['checkpoint']).stem)} ({exploit['from_timesteps']:,} env steps)" in log
    rows = [json.loads(x) for x in (tmp_path / "a" / copy["folder"] / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["iteration"] == int(Path(exploit["checkpoint"]).stem) + 1

    out = subprocess.run([PYTHON, "-m", "fiberrl.plot", str(tmp_path / "a"), "-o", str(tmp_path / "pbt.png")],
                         cwd=ROOT, text=True, capture_output=True)
    assert out.returncode == 0 and (tmp_path / "pbt.png").stat().st_size > 10_000, out.stderr


@pytest.mark.slow
def test_the_final_selection_names_the_member_whose_final_policy_runs_best_and_is_kept(tmp_path):
    from fiberrl.evaluate import evaluate
    args = [*ES, *SMALL_POPULATION, "hydra.sweeper.synchronous=true", f"hydra.sweep.dir={tmp_path}"]
    code, out, err = sweep([*args, "hydra.sweeper.final_episodes=3", "hydra.sweeper.final_seed=500"])
    assert code == 0, err
    assert "; the best named by 3 episodes of each final policy;" in out.splitlines()[0]
    finals = {e["member"]: e for e in lineage(tmp_path, "final")}
    assert sorted(finals) == [0, 1, 2] and all(e["episodes"] == 3 and e["seed"] == 500 for e in finals.values())
    for member, final in finals.items():  # what fiberrl.evaluate gives for that member's final policy
        folder = tmp_path / f"member_{member}" / f"segment_{final['segment']:03d}"
        returns = [r for r, _ in evaluate(folder, 3, 500, "latest")]
        assert final["mean"] == pytest.approx(np.mean(returns)) and final["std"] == pytest.approx(np.std(returns))
    best = max(finals, key=lambda m: (finals[m]["mean"], -m))
    named = next(line for line in out.splitlines() if line.startswith("pbt: best member"))
    assert named.startswith(f"pbt: best member {best}, {finals[best]['mean']:.2f} ± ") and \
        "over its final 3 episodes (eval_reward " in named, out

    # run again, the selection is read back, not run again; with other episodes it is run again
    code, out, err = sweep([*args, "hydra.sweeper.final_episodes=3", "hydra.sweeper.final_seed=500"])
    assert code == 0, err
    assert len(lineage(tmp_path, "final")) == 3 and named in out.splitlines()
    # a member whose final checkpoint is damaged is left out, in one line
    damaged = lineage(tmp_path, "ended")[-1]
    (tmp_path / damaged["checkpoint"]).write_bytes(b"not a checkpoint")
    code, out, err = sweep([*args, "hydra.sweeper.final_episodes=2", "hydra.sweeper.final_seed=500"])
    assert code == 0, err
    said = [line for line in out.splitlines() if "final policy cannot be run" in line]
    assert len(said) == 1 and said[0].startswith(f"pbt: member {damaged['member']}'s final policy cannot be run ("), out
    again = [e for e in lineage(tmp_path, "final") if e["episodes"] == 2]
    assert sorted(e["member"] for e in again if "mean" in e) == sorted({0, 1, 2} - {damaged["member"]})


@pytest.mark.slow
def test_a_ttest_sweep_copies_only_where_its_recorded_values_pass_the_test(tmp_path):
    from hydra_plugins.fiberrl_pbt.population import welch_p_value
    args = [*ES, *SMALL_POPULATION, "hydra.sweeper.synchronous=true", "hydra.sweeper.selection=ttest",
            "hydra.sweeper.window=2", "hydra.sweeper.significance=0.3"]
    code, out, err = sweep([*args, f"hydra.sweep.dir={tmp_path}"])
    assert code == 0, err
    assert ("a ready member copies another drawn at random when Welch's t-test on their last 2 values says it is "
            "better (p < 0.3)") in out.splitlines()[0]
    exploits = lineage(tmp_path, "exploit")
    assert exploits, "no member copied another"
    for exploit in exploits:
        assert exploit["p_value"] < 0.3
        assert exploit["p_value"] == welch_p_value(exploit["from_values"], exploit["to_values"], True)


@pytest.mark.slow
def test_a_pb2_sweep_chooses_settings_by_its_bandit_within_its_radius_and_again_the_same(tmp_path):
    from hydra_plugins.fiberrl_pbt.mutations import parse
    args = [*ES, *SMALL_POPULATION, "hydra.sweeper.synchronous=true", "hydra.sweeper.explore=pb2",
            "hydra.sweeper.pb2_radius=0.3", "algo.iterations=8"]
    code, out, err = sweep([*args, f"hydra.sweep.dir={tmp_path / 'a'}"])
    assert code == 0, err
    assert ("a copy's settings chosen by PB2's bandit within 0.3 of its donor's (perturbed until 3 segments have "
            "ended from a score)") in out.splitlines()[0]
    exploits = lineage(tmp_path / "a", "exploit")
    chosen = [e for e in exploits if e["explored"] == "pb2"]
    assert chosen, [e["explored"] for e in exploits]
    # the first ready point has too few segments ended to fit a process: perturbed, and said why
    assert exploits[0]["explored"] == "perturbed", exploits[0]
    assert exploits[0]["pb2"]["fallback"] in ("the donor has no score to begin from",
                                              f"{exploits[0]['pb2'].get('observations')} segments ended, fewer than 3")
    spaces = {"algo.sigma": parse("algo.sigma", "tag(log, interval(0.002, 0.5))", 0, [0.8, 1.2], integer=False),
              "algo.learning_rate": parse("algo.learning_rate", "tag(log, interval(1e-4, 0.2))", 0, [0.8, 1.2],
                                          integer=False)}
    for exploit in chosen:
        assert exploit["pb2"]["observations"] >= 3 and {"mean", "std"} <= exploit["pb2"].keys()
        # generational: the donor had ended its segment, and the checkpoint copied is that segment's last
        donor = next(e for e in lineage(tmp_path / "a", "segment")
                     if e["folder"] == str(Path(*Path(exploit["checkpoint"]).parts[:2])))
        for key, space in spaces.items():  # 6 significant digits on the command line: a hair past the radius
            assert abs(space.unit(exploit["new"][key]) - space.unit(donor["settings"][key])) <= 0.3 + 1e-5
    code, _, err = sweep([*args, f"hydra.sweep.dir={tmp_path / 'b'}"])
    assert code == 0, err
    assert decisions(tmp_path / "a") == decisions(tmp_path / "b")
    for member in range(3):
        assert np.array_equal(last_theta(tmp_path / "a", member), last_theta(tmp_path / "b", member))


@pytest.mark.slow
@pytest.mark.parametrize("selection", ["truncation", "ttest"])
def test_a_damaged_checkpoint_is_replaced_by_a_top_members_copy(tmp_path, selection):
    sweep_dir = tmp_path / "sweep"
    # one run at a time: member 0's first segment has ended long before the generation's decisions
    proc = sweep([*ES, *SMALL_POPULATION, "hydra.sweeper.synchronous=true", "hydra.launcher.runs_at_once=1",
                  f"hydra.sweeper.selection={selection}", f"hydra.sweep.dir={sweep_dir}"], wait=False)
    assert wait_until(lambda: (sweep_dir / "pbt.jsonl").exists() and any(
        e["member"] == 0 for e in lineage(sweep_dir, "ended")), 120)
    ended = next(e for e in lineage(sweep_dir, "ended") if e["member"] == 0)
    (sweep_dir / ended["checkpoint"]).write_bytes(b"not a checkpoint")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    said = [line for line in out.splitlines() if "member 0's checkpoint is damaged" in line]
    assert len(said) == 1 and "it goes on from a copy of member" in said[0], out
    assert any(e["to"] == 0 and e["damaged"] for e in lineage(sweep_dir, "exploit"))
    assert "0 exploits" not in next(line for line in out.splitlines() if line.startswith("  member 0:"))


def kill_a_running_member(sweep_dir: Path) -> bool:
    """SIGKILL the job of a segment that has begun and not ended; False if none could be killed just now."""
    ended = {(e["member"], e["segment"]) for e in lineage(sweep_dir, "ended")}
    for event in lineage(sweep_dir, "segment"):
        where = sweep_dir / event["folder"] / ".hydra" / "job_where.json"
        if (event["member"], event["segment"]) not in ended and where.exists():
            try:
                os.kill(json.loads(where.read_text())["pid"], signal.SIGKILL)
                return True
            except (ProcessLookupError, ValueError):
                continue
    return False


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["selection=truncation", "selection=ttest", "ranking=ready"])
def test_an_asynchronous_sweep_survives_a_killed_member_and_resumes_after_it_is_killed(tmp_path, choice):
    sweep_dir = tmp_path / "sweep"
    args = [*ES, *SMALL_POPULATION, f"hydra.sweep.dir={sweep_dir}", "algo.iterations=8", f"hydra.sweeper.{choice}"]
    proc = sweep(args, wait=False)
    # a member's job is killed: the launcher starts it again from its own checkpoint
    assert wait_until(lambda: (sweep_dir / "pbt.jsonl").exists() and len(lineage(sweep_dir, "ended")) >= 2, 120)
    assert wait_until(lambda: kill_a_running_member(sweep_dir), 60)
    # then the whole sweep
    assert wait_until(lambda: len(lineage(sweep_dir, "ended")) >= 6, 120)
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    assert any("its job died (killed by SIGKILL)" in line and line.endswith("starting it again from its checkpoint")
               for line in (out + err).splitlines()), out + err
    before = lineage(sweep_dir)
    with open(sweep_dir / "pbt.jsonl", "a") as fh:  # as a kill in the middle of writing a record leaves it
        fh.write('{"event": "segment", "member": 0, "segm')

    code, out, err = sweep(args)
    assert code == 0, err
    assert out.splitlines()[0].endswith("(resumed)")
    events = lineage(sweep_dir)  # every line a record: the cut one dropped, none glued to it
    assert events[:len(before)] == before  # the lineage is kept, and goes on
    segments = [(e["member"], e["segment"]) for e in events if e["event"] == "segment"]
    assert len(segments) == len(set(segments))
    for member in range(3):
        indices = sorted(i for m, i in segments if m == member)
        assert indices == list(range(len(indices)))
    assert all(f"  member {m}: finished" in out for m in range(3)), out
    if choice == "ranking=ready":  # each copy is of a ready point where its donor ranked on top, across the resume
        assert "copied only from one where it ranked on top (Ray Tune's rules)" in out.splitlines()[0]
        records, exploits = [e for e in events if e["event"] == "segment"], [e for e in events if e["event"] == "exploit"]
        assert exploits, "no member copied another"
        for exploit in exploits:
            ready = next(e for e in events if e["event"] == "ended" and e["checkpoint"] == exploit["checkpoint"])
            went_on = next(e for e in records if (e["member"], e["segment"]) == (ready["member"], ready["segment"] + 1))
            assert went_on["ranked_top"] and ready["member"] == exploit["from"]


@pytest.mark.slow
@pytest.mark.parametrize("explore", ["perturb", "pb2"])
def test_a_generational_sweep_stopped_between_two_decisions_decides_the_rest_as_it_would_have(tmp_path, explore):
    """Stopped after one member's decision at a ready point and before another's, a generational sweep run again
    decides the others against that generation as it ended, not a generation later (with PB2, beside the settings
    the decided member goes on with, though its segment ended while the sweep was stopped): its lineage and
    parameters are the uninterrupted sweep's."""
    args = [*ES, *SMALL_POPULATION, "hydra.sweeper.synchronous=true", "algo.iterations=8",
            f"hydra.sweeper.explore={explore}"]
    code, _, err = sweep([*args, f"hydra.sweep.dir={tmp_path / 'a'}"])
    assert code == 0, err
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    events = lineage(tmp_path / "b")
    begun = [i for i, e in enumerate(events) if e["event"] == "segment" and e["segment"] >= 1]
    # the last ready point with two decisions: a PB2 decision there has observations to choose by
    cut = [i for i, j in zip(begun, begun[1:]) if events[i]["segment"] == events[j]["segment"]][-1]
    kept = events[:cut + 1]
    (tmp_path / "b" / "pbt.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    for member in range(3):  # the decided member's segment ran on while the sweep was stopped; nothing after it
        last = max(e["segment"] for e in kept if e["event"] == "segment" and e["member"] == member)
        for later in sorted((tmp_path / "b" / f"member_{member}").glob("segment_*"))[last + 1:]:
            shutil.rmtree(later)

    code, out, err = sweep([*args, f"hydra.sweep.dir={tmp_path / 'b'}"])
    assert code == 0, err
    assert out.splitlines()[0].endswith("(resumed)")
    assert decisions(tmp_path / "a") == decisions(tmp_path / "b")
    for member in range(3):
        assert np.array_equal(last_theta(tmp_path / "a", member), last_theta(tmp_path / "b", member))
    if explore == "pb2":
        assert any(e.get("explored") == "pb2" for e in lineage(tmp_path / "b", "exploit")[-2:])


def _stopped_once_every_first_segment_began(args, sweep_dir) -> list[dict]:
    """Run the sweep of ``args``, then leave it as it stands when it is stopped once every member's first segment
    has begun and none is taken as ended, their jobs done: the lineage cut there (returned) and the later
    segments' folders gone."""
    code, _, err = sweep(args)
    assert code == 0, err
    events = lineage(sweep_dir)
    begun = [i for i, e in enumerate(events) if e["event"] == "segment" and e["segment"] == 0]
    assert len(begun) == 3 and not any(e["event"] == "ended" for e in events[:begun[-1]])
    kept = events[:begun[-1] + 1]
    (sweep_dir / "pbt.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    for member in range(3):
        for later in sorted((sweep_dir / f"member_{member}").glob("segment_*"))[1:]:
            shutil.rmtree(later)
    return kept


@pytest.mark.slow
def test_segments_that_ended_while_the_sweep_was_stopped_are_taken_in_the_order_they_ended(tmp_path):
    """A sweep stopped while its members' jobs went on finds them done when run again. It takes them in the
    order their jobs ended, as it would have running, not in member order: the one that ended first decides
    first."""
    sweep_dir = tmp_path / "sweep"
    args = [*ES, *SMALL_POPULATION, f"hydra.sweep.dir={sweep_dir}"]
    kept = _stopped_once_every_first_segment_began(args, sweep_dir)
    for member in range(3):  # their jobs end while it is stopped, member 0 last and member 2 first
        ended_at = 1_700_000_000 + 10 * (2 - member)
        os.utime(sweep_dir / f"member_{member}/segment_000" / RETURN_FILE, (ended_at, ended_at))

    code, out, err = sweep(args)
    assert code == 0, err
    assert out.splitlines()[0].endswith("(resumed)")
    taken = [e["member"] for e in lineage(sweep_dir)[len(kept):] if e["event"] == "ended"]
    assert taken[:3] == [2, 1, 0], taken
    assert all(f"  member {m}: finished" in out for m in range(3)), out


@pytest.mark.slow
def test_a_member_that_ended_while_the_sweep_was_stopped_is_ranked_against_the_others_as_they_stood_then(tmp_path):
    """Run again, a sweep ranks a member whose job ended while it was stopped against the others as they stood
    when that job ended: the rows they had logged by then (each row's wall_time) and the checkpoints they had
    written by then, not what they logged and wrote after."""
    sweep_dir = tmp_path / "sweep"
    args = [*ES, *SMALL_POPULATION, f"hydra.sweep.dir={sweep_dir}"]
    kept = _stopped_once_every_first_segment_began(args, sweep_dir)
    # member 2's job ended first, at `ended`, the worst; by then members 0 and 1 had logged all but their last
    # row, member 1 ahead; member 0's last row, logged after, would put it far ahead
    ended = 1_700_000_000
    scores = {0: 10.0, 1: 20.0, 2: 0.0}
    copied_at = {}
    for member in range(3):
        folder = sweep_dir / f"member_{member}" / "segment_000"
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) >= 2, rows
        for k, row in enumerate(rows):
            after = member < 2 and k == len(rows) - 1
            row["wall_time"] = ended + 5 if after else ended - 10 + k
            row["eval_reward"] = 1000.0 if after and member == 0 else scores[member]
            checkpoint = folder / "checkpoints" / f"{row['iteration']:06d}.npz"
            if checkpoint.exists():
                os.utime(checkpoint, (row["wall_time"], row["wall_time"]))
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        copied_at[member] = rows[-2]
        return_at = ended if member == 2 else ended + 20 - 10 * member
        os.utime(folder / RETURN_FILE, (return_at, return_at))

    code, out, err = sweep(args)
    assert code == 0, err
    resumed = lineage(sweep_dir)[len(kept):]
    assert [e["member"] for e in resumed if e["event"] == "ended"][:3] == [2, 1, 0]
    exploit = next(e for e in resumed if e["event"] == "exploit")
    assert (exploit["to"], exploit["from"]) == (2, 1), exploit
    assert exploit["from_score"] == pytest.approx(20.0)
    assert exploit["from_timesteps"] == copied_at[1]["timesteps"]
    assert Path(exploit["checkpoint"]).name == f"{copied_at[1]['iteration']:06d}.npz"


@pytest.mark.slow
def test_ppo_members_exploit_with_their_normalisers_and_optimizer(tmp_path):
    sweep_dir = tmp_path / "sweep"
    code, out, err = sweep(["-m", "fiberrl", "-m", "hydra/sweeper=pbt", *SMALL_PPO, "algo.total_timesteps=192",
                            "algo.norm_obs=true", "algo.norm_reward=true", "hydra.sweeper.population=2",
                            "hydra.sweeper.quantile=0.5", "hydra.sweeper.interval=48",
                            "hydra.sweeper.metric=charts/episodic_return", "hydra.sweeper.window=1",
                            "algo.learning_rate=tag(log, interval(1e-4, 1e-2))", "hydra.launcher.table=off",
                            f"hydra.sweep.dir={sweep_dir}"])
    assert code == 0, err
    assert "mutating algo.learning_rate in log [0.0001, 0.01];" in out.splitlines()[0]
    exploits = lineage(sweep_dir, "exploit")
    assert exploits
    exploit = exploits[0]
    went_on = next(e for e in lineage(sweep_dir, "segment") if e["start_from"] == exploit["checkpoint"]
                   and e["member"] == exploit["to"])
    with np.load(sweep_dir / exploit["checkpoint"]) as data:
        donor = {k: data[k] for k in data.files}
    assert {"obs_rms", "ret_rms", "optim"} <= {k.split("/")[0] for k in donor}, list(donor)
    # the member's run went on from there with its own learning rate
    rows = [json.loads(x) for x in (sweep_dir / went_on["folder"] / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["timesteps"] == exploit["from_timesteps"] + 16
    assert rows[0]["charts/learning_rate"] != pytest.approx(0.0)
    donor_folder = str(Path(exploit["checkpoint"]).parent.parent)
    donor_lr = next(e for e in lineage(sweep_dir, "segment") if e["folder"] == donor_folder)["settings"]
    new_lr = went_on["settings"]["algo.learning_rate"]
    if new_lr != donor_lr["algo.learning_rate"]:
        log = (sweep_dir / went_on["folder"] / "output.log").read_text()
        assert f"with algo.learning_rate={new_lr!r} (it ran with {donor_lr['algo.learning_rate']!r})" in log, log


@pytest.mark.slow
@pytest.mark.parametrize("args, said", [
    (["hydra.sweeper.population=1"], "hydra.sweeper.population=1: must be at least 2"),
    (["hydra.sweeper.quantile=0.6"], "hydra.sweeper.quantile=0.6: must be in (0, 0.5]"),
    (["hydra.sweeper.selection=tournament"], "hydra.sweeper.selection=tournament: must be truncation or ttest"),
    (["hydra.sweeper.selection=ttest", "hydra.sweeper.significance=1.5"],
     "hydra.sweeper.significance=1.5: must be in (0, 1)"),
    (["hydra.sweeper.selection=ttest", "hydra.sweeper.window=1"],
     "hydra.sweeper.window=1: selection=ttest compares two members' last `window` values with Welch's t-test"),
    (["hydra.sweeper.final_episodes=-1"], "hydra.sweeper.final_episodes=-1: must be 0 (name the best member by"),
    (["hydra.sweeper.final_seed=-1"], "hydra.sweeper.final_seed=-1: must be 0 or more"),
    (["algo=ppo", "algo.target_kl=interval(0.01,0.05)"],
     "algo.target_kl starts at null, which cannot be perturbed within algo.target_kl in [0.01, 0.05]; give it a "
     "start (algo.target_kl=...) or hydra.sweeper.sample_initial=true"),
    (["hydra.sweeper.ranking=later"], "hydra.sweeper.ranking=later: must be now (the others as they are now) or "
                                      "ready"),
    (["hydra.sweeper.explore=anneal"], "hydra.sweeper.explore=anneal: must be perturb (PBT's random perturbations) "
                                       "or pb2"),
    (["hydra.sweeper.explore=pb2", "hydra.sweeper.pb2_radius=0"], "hydra.sweeper.pb2_radius=0.0: must be in (0, 1]"),
    (["hydra.sweeper.explore=pb2", "algo.sigma=choice(0.01,0.02)"],
     "hydra.sweeper.explore=pb2 chooses values within intervals, and algo.sigma in {0.01, 0.02} holds none"),
    (["algo.sigma=interval(0.5,0.1)"], "algo.sigma=interval(0.5,0.1): an empty range"),
    (["algo.sigma=interval(-1,0.1)"], "reaches algo.sigma=-1.0, which no run takes"),
    (["algo.noise_size=interval(1,2)"], "algo.noise_size is not a setting algo=es lets a resume change"),
    (["algo.nonsense=interval(1,2)"], "algo.nonsense is not a setting of algo=es; it may mutate "
                                      "algo.learning_rate, algo.sigma"),
    (["hydra.sweeper.metric=charts/SPS"], "hydra.sweeper.metric=charts/SPS: algo=es does not write it"),
    (["algo.eval_episodes=0"], "the runs do not evaluate"),
    (["+experiment=poet_small"], "algo=poet declares no setting a resume may change"),
    (["hydra/launcher=basic"], "hydra/sweeper=pbt runs its members on hydra/launcher=fiberrl"),
])
def test_bad_input_is_one_line_before_any_member_starts(tmp_path, args, said):
    sweep_dir = tmp_path / "sweep"
    base = ES if "=" in args[0] and args[0].startswith(("hydra.", "algo.")) else ES[:4]
    code, out, err = sweep([*base, *args, f"hydra.sweep.dir={sweep_dir}"], timeout=60)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and said in lines[0], err
    assert not list(sweep_dir.glob("member_*"))


# kubernetes: against the stand-in API server (tests/helpers/k8s_standin), no cluster being able to run here
@pytest.mark.parametrize("backend", [pytest.param(name, marks=[pytest.mark.slow, getattr(pytest.mark, name)])
                                     for name in ("docker", "slurm", "kubernetes")])
def test_members_are_jobs_of_a_cluster_backend(backend, tmp_path):
    import importlib
    import shutil
    import time
    helper = importlib.import_module(f"helpers.{backend}_backend")
    reason = helper.available()
    if reason:
        pytest.skip(reason)
    settings = {k: v for k, v in helper.settings().items() if k != "backend"}
    # under the working directory, which the backends share with their jobs
    sweep_dir = Path(ROOT) / "runs" / "test-sweeps" / f"pbt-{backend}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        code, out, err = sweep([*ES, *SMALL_POPULATION, f"backend={backend}", f"hydra.sweep.dir={sweep_dir}",
                                "hydra.sweeper.final_episodes=2",
                                *[f"backend.settings.{k}={v!r}" for k, v in settings.items()]], timeout=900)
        assert code == 0, f"{out}\n{err}"
        assert all(f"  member {m}: finished" in out for m in range(3)), out
        # the final selection runs the members' final policies here, from the folders their jobs wrote
        assert sorted(e["member"] for e in lineage(sweep_dir, "final") if "mean" in e) == [0, 1, 2], out
        where = [json.loads((folder / ".hydra" / "job_where.json").read_text())
                 for folder in sweep_dir.glob("member_*/segment_*")]
        if backend == "docker":  # each in a container
            assert os.uname().nodename not in {w["host"] for w in where}, where
        if backend == "slurm":
            assert all(w["slurm_job_id"] for w in where), where
        assert wait_until(lambda: not helper.leftovers(), 60), helper.leftovers()
    finally:
        shutil.rmtree(sweep_dir, ignore_errors=True)
