"""What ``hydra/sweeper=pbt`` does with input that is wrong or damaged, decided without running a member: a
lineage file cut short by a kill (resumed, and resumed again), or damaged (one line, nothing lost), a setting
whose start cannot be perturbed, perturbation factors that are not a list, another exploration on a resume,
and a member whose metric goes to NaN."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

# the errors through their modules when raised: a Hydra run in this process (another test's) executes the
# plugin modules again, and what they raise then is a class of that execution
from hydra_plugins.fiberrl_pbt import mutations, sweeper as pbt
from hydra_plugins.fiberrl_pbt.mutations import parse
from hydra_plugins.fiberrl_pbt.population import Member, Segment, choose_donor, welch_p_value
from hydra_plugins.fiberrl_pbt.sweeper import LINEAGE, PBTSweeper


def sweeper_in(sweep_dir: Path, mutated=(), mode: str = "max") -> PBTSweeper:
    """A sweeper set up as ``_prepare`` leaves one, its segments collected instead of run."""
    sweeper = PBTSweeper(population=2, interval=100, burn_in=0, metric="eval_reward", mode=mode, window=2,
                         quantile=0.5, params={}, resample_probability=0.25, perturb_factors=[0.8, 1.2],
                         sample_initial=False, synchronous=False, seed=0)
    sweeper.sweep_dir, sweeper.mutations, sweeper.decision_seed, sweeper._started = sweep_dir, list(mutated), 0, 0.0
    sweeper.base_seed, sweeper.fixed = 0, ["algo=es"]
    sweeper.launched = []
    sweeper._launch = sweeper.launched.append
    return sweeper


def header(sweeper: PBTSweeper) -> str:
    return json.dumps({"event": "sweep", "time": 0.0, "settings": sweeper._settings_record()}) + "\n"


def segment_record(member: int) -> str:
    return json.dumps({"event": "segment", "member": member, "segment": 0, "job": member,
                       "folder": f"member_{member}/segment_000", "seed": member, "settings": {}, "until": 100,
                       "start_from": None, "start_timesteps": 0, "carried": [], "stands_at": None}) + "\n"


def every_line_a_record(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("cut", ["a record", "the header"])
def test_a_lineage_cut_short_by_a_kill_resumes_and_resumes_again(tmp_path, cut):
    """The kill cut the last line short: the resumed sweep drops it, and what it appends begins a line of its
    own, so that the sweep resumes again (before, the next record was glued to the cut one, and the next resume
    found the file damaged)."""
    sweeper = sweeper_in(tmp_path)
    whole = header(sweeper) + segment_record(0) if cut == "a record" else ""
    cut_short = (segment_record(1) if cut == "a record" else header(sweeper))[:20]
    (tmp_path / LINEAGE).write_text(whole + cut_short)

    resumed = sweeper._replay()  # the cut header is no sweep yet: it begins anew
    assert resumed is (cut == "a record")
    sweeper._record({"event": "failed", "member": 0, "segment": 0, "why": "a test"} if resumed else
                    json.loads(segment_record(0)))

    events = every_line_a_record(tmp_path / LINEAGE)
    assert [e["event"] for e in events] == (["sweep", "segment", "failed"] if resumed else ["sweep", "segment"])
    again = sweeper_in(tmp_path)
    assert again._replay() is True and len(again.members[0].segments) == 1


@pytest.mark.parametrize("damage, said", [
    (b"42\n", "line 3 is not a lineage record"),
    (b"\xff\xfe not text\n", "line 3 is not a lineage record"),
    (b'{"event": "ended", "member": 0, "segment": 0}\n', "a record does not fit the ones before it (KeyError"),
    (json.dumps({"event": "ended", "member": 0, "segment": 3, "timesteps": 1, "values": [], "checkpoint": None,
                 "paused": True}).encode() + b"\n", "a record does not fit the ones before it (IndexError"),
])
def test_a_damaged_lineage_is_one_line_and_left_as_it_was(tmp_path, damage, said):
    sweeper = sweeper_in(tmp_path)
    damaged = header(sweeper).encode() + segment_record(0).encode() + damage + segment_record(1).encode()
    (tmp_path / LINEAGE).write_bytes(damaged)
    with pytest.raises(pbt.PBTError) as caught:
        sweeper._replay()
    assert said in str(caught.value) and "choose another hydra.sweep.dir" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert (tmp_path / LINEAGE).read_bytes() == damaged


def test_a_resume_with_another_exploration_is_refused(tmp_path):
    usual = parse("algo.sigma", "interval(0.01, 0.1)", 0.25, (0.8, 1.2), False)
    other = parse("algo.sigma", {"space": "interval(0.01, 0.1)", "factors": [0.5, 2.0]}, 0.25, (0.8, 1.2), False)
    assert usual.exploration() == ""  # a sweep begun before exploration was recorded resumes
    assert other.exploration() == ", resampled with p=0.25, else x 0.5 or x 2"
    sweeper_in(tmp_path, [usual])._replay()
    with pytest.raises(pbt.PBTError, match="holds a PBT sweep with other settings"):
        sweeper_in(tmp_path, [other])._replay()


def test_perturbation_factors_must_be_a_list_and_values_stay_in_their_space():
    with pytest.raises(mutations.MutationError, match=r"perturbation factors 1.2 must be a list of positive numbers"):
        parse("algo.sigma", {"space": "interval(0.01, 0.1)", "factors": 1.2}, 0.25, (0.8, 1.2), False)
    near_one = parse("algo.gae_lambda", "interval(0.8, 0.9999999)", 0.25, (0.8, 1.2), False)
    assert near_one.fit(0.9999999) == 0.9999999  # 6 digits would make it 1.0, out of its space


def test_a_metric_gone_to_nan_ranks_its_member_last_and_it_copies_a_top_member(tmp_path):
    for mode, worst in [("max", -math.inf), ("min", math.inf)]:
        sweeper = sweeper_in(tmp_path / mode, mode=mode)
        folder = tmp_path / mode / "member_1" / "segment_000"
        folder.mkdir(parents=True)
        rows = [{"iteration": 0, "timesteps": 50, "eval_reward": 900.0},
                {"iteration": 1, "timesteps": 100, "eval_reward": float("nan")}]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        assert sweeper._metric_values(folder) == [900.0, worst]

    def ended(index: int, values: list) -> Member:
        return Member(index, [Segment(index, 0, index, Path(f"m{index}"), index, {}, 100, state="ended",
                                      timesteps=100, values=values, checkpoint=f"member_{index}/c.npz", paused=True)])
    members = [ended(0, [10.0, 12.0]), ended(1, [900.0, -math.inf])]
    standings = {m.index: m.standing(2) for m in members}
    assert choose_donor(1, standings, True, 0.5, np.random.default_rng(0)) == 0  # not left at 900
    assert choose_donor(0, standings, True, 0.5, np.random.default_rng(0)) is None  # nor ever copied
    assert welch_p_value([10.0, 12.0], [900.0, -math.inf], maximize=True) == 0.0
    assert welch_p_value([900.0, -math.inf], [10.0, 12.0], maximize=True) == 1.0


def test_a_copy_that_logged_nothing_copies_again_at_its_own_score(tmp_path):
    """A ready point that comes before the copy's first evaluation: it stands where it stood before it copied
    (``stands_at``), not at the score of the donor's values it carries."""
    from fiberrl.run import save_npz

    path = tmp_path / "member_1/segment_000/checkpoints/000001.npz"
    path.parent.mkdir(parents=True)
    save_npz(path, {"theta": np.zeros(3)}, {"timesteps": 100, "format": 2})
    sweeper = sweeper_in(tmp_path)
    copy = Segment(0, 1, 2, tmp_path / "member_0/segment_001", 0, {}, 200, start_from="member_1/x.npz",
                   start_timesteps=100, carried=[50.0, 52.0], stands_at=-5.0, state="ended", timesteps=200,
                   checkpoint="member_0/segment_001/checkpoints/000002.npz", paused=True)
    leader = Segment(1, 0, 1, tmp_path / "member_1/segment_000", 1, {}, 100, state="ended", timesteps=100,
                     values=[60.0, 61.0], checkpoint=str(path.relative_to(tmp_path)), paused=True)
    sweeper.members = [Member(0, [Segment(0, 0, 0, tmp_path / "m0", 0, {}, 100), copy]), Member(1, [leader])]
    sweeper._go_on(sweeper.members[0])
    assert sweeper.launched[0].stands_at == -5.0
    exploit = [json.loads(line) for line in (tmp_path / LINEAGE).read_text().splitlines()][0]
    assert exploit["event"] == "exploit" and exploit["to_score"] == -5.0


def test_a_sweep_folder_that_holds_another_sweep_is_refused_and_left_as_it_was(tmp_path):
    """Refused once the launcher is open, the sweep closes it (its display stopped) and writes nothing there:
    not even the launcher's table over the other sweep's."""
    from conftest import ROOT
    from helpers.script_runs import run_sweep
    from helpers.small_runs import small_es

    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    other = {"event": "sweep", "time": 0.0, "settings": {"population": 5}}
    (sweep_dir / LINEAGE).write_text(json.dumps(other) + "\n")
    (sweep_dir / "sweep.csv").write_text("the other sweep's table\n")
    code, out, err = run_sweep(["-m", "fiberrl", "-m", "hydra/sweeper=pbt", "algo=es", *small_es(43, 250_043),
                                f"hydra.sweep.dir={sweep_dir}"], ROOT, timeout=120)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "holds a PBT sweep with other settings" in lines[0], err
    assert (sweep_dir / "sweep.csv").read_text() == "the other sweep's table\n"
    assert (sweep_dir / LINEAGE).read_text() == json.dumps(other) + "\n"
    assert sorted(p.name for p in sweep_dir.iterdir()) == [LINEAGE, "sweep.csv"]
