"""PB2's explore (``hydra.sweeper.explore=pb2``) without processes: the Gaussian-process bandit chooses where the
change it has seen is largest, spreads members ready together, keeps to its radius of the donor's settings, and
chooses the same again from the same generator; the mutations' share of their space, both ways."""
import numpy as np
import pytest

from hydra_plugins.fiberrl_pbt.bandit import MIN_OBSERVATIONS, Observation, negative_log_likelihood, suggest
from hydra_plugins.fiberrl_pbt.mutations import parse


def observations(count=32, seed=0):
    """Segments whose change peaks at a first setting of 0.3 and grows a little with the second, with noise."""
    rng = np.random.default_rng(seed)
    found = []
    for i in range(count):
        unit = rng.uniform(0, 1, 2)
        change = -10 * (unit[0] - 0.3) ** 2 + 0.1 * unit[1] + rng.normal(0, 0.05)
        found.append(Observation(1000 * (1 + i // 4), float(rng.normal()), tuple(unit), float(change)))
    return found


def test_the_bandit_chooses_where_the_change_is_largest_and_the_same_again_from_the_same_generator():
    seen = observations()
    chosen, said = suggest(seen, 9000, 0.0, [], (0.5, 0.5), 1.0, np.random.default_rng(1))
    assert abs(chosen[0] - 0.3) < 0.05 and chosen[1] > 0.6, chosen
    assert said["observations"] == 32 and said["mean"] > 1 and said["std"] >= 0
    again, _ = suggest(seen, 9000, 0.0, [], (0.5, 0.5), 1.0, np.random.default_rng(1))
    assert np.array_equal(chosen, again)
    # where nothing was seen, the bound is wide: a process that has seen one point's changes only looks away from it
    alike = [Observation(1000 * (1 + i), float(i), (0.8, 0.2), float(i % 3)) for i in range(8)]
    far, _ = suggest(alike, 9000, 0.0, [], (0.8, 0.2), 1.0, np.random.default_rng(1))
    assert np.linalg.norm(far - (0.8, 0.2)) > 0.2, far


def test_settings_other_members_run_with_move_the_choice_away_from_them():
    seen = observations()
    alone, _ = suggest(seen, 9000, 0.0, [], (0.5, 0.5), 1.0, np.random.default_rng(1))
    beside, _ = suggest(seen, 9000, 0.0, [tuple(alone)], (0.5, 0.5), 1.0, np.random.default_rng(1))
    assert np.linalg.norm(beside - alone) > 0.1, (alone, beside)


def test_the_choice_keeps_within_its_radius_of_the_donors_settings():
    seen = observations()
    for around in [(0.9, 0.1), (0.0, 1.0), (0.5, 0.5)]:
        chosen, _ = suggest(seen, 9000, 0.0, [], around, 0.2, np.random.default_rng(2))
        assert np.all(np.abs(chosen - around) <= 0.2 + 1e-9) and np.all((0 <= chosen) & (chosen <= 1)), chosen
    # towards the peak, as far as the radius lets it
    chosen, _ = suggest(seen, 9000, 0.0, [], (0.9, 0.5), 0.2, np.random.default_rng(2))
    assert chosen[0] == pytest.approx(0.7, abs=0.02), chosen


def test_too_few_or_alike_observations_choose_nothing_and_say_why():
    seen = observations()
    assert suggest(seen[:MIN_OBSERVATIONS - 1], 9000, 0.0, [], (0.5, 0.5), 1.0, np.random.default_rng(0)) == \
        (None, {"observations": 2, "fallback": "2 segments ended, fewer than 3"})
    flat = [Observation(o.timesteps, o.before, o.unit, 0.25) for o in seen]
    assert suggest(flat, 9000, 0.0, [], (0.5, 0.5), 1.0, np.random.default_rng(0)) == \
        (None, {"observations": 32, "fallback": "every segment's score changed alike"})


def test_a_kernel_matrix_that_will_not_factor_chooses_nothing_and_says_why(monkeypatch):
    # the fitted noise keeps the matrix positive definite for any observations a sweep records, so the failure of
    # the factorisation is injected: numpy's own LinAlgError, raised where numpy raises it
    def fails(matrix):
        raise np.linalg.LinAlgError("Matrix is not positive definite")
    monkeypatch.setattr(np.linalg, "cholesky", fails)
    assert suggest(observations(), 9000, 0.0, [], (0.5, 0.5), 1.0, np.random.default_rng(0)) == \
        (None, {"observations": 32, "fallback": "the kernel matrix was not positive definite"})


def test_the_fit_prefers_the_noise_the_data_has():
    seen = observations()
    x = np.array([[o.timesteps / 8000, o.before, *o.unit] for o in seen])
    y = np.array([o.change for o in seen])
    y = (y - y.mean()) / y.std()
    quiet, loud = np.log([1.0, 0.3, 0.1, 0.01]), np.log([1.0, 0.3, 0.1, 1.0])
    assert negative_log_likelihood(quiet, x, y) < negative_log_likelihood(loud, x, y)


def test_a_mutation_gives_its_share_of_the_space_and_back():
    lr = parse("algo.learning_rate", "tag(log, interval(1e-5, 1e-2))", 0.25, [0.8, 1.2], integer=False)
    assert lr.unit(1e-5) == 0 and lr.unit(1e-2) == 1 and lr.unit(1e-4) == pytest.approx(1 / 3)
    assert lr.from_unit(2 / 3) == pytest.approx(1e-3) and lr.from_unit(lr.unit(3e-3)) == pytest.approx(3e-3)
    assert lr.unit(1.0) == 1 and lr.unit(0.0) == 0  # outside the space: its nearest end
    clip = parse("algo.clip_coef", "interval(0.05, 0.5)", 0.25, [0.8, 1.2], integer=False)
    assert clip.unit(0.275) == pytest.approx(0.5) and clip.from_unit(0.5) == 0.275
    epochs = parse("algo.update_epochs", "interval(1, 11)", 0.25, [0.8, 1.2], integer=True)
    assert epochs.from_unit(0.44) == 5 and isinstance(epochs.from_unit(0.44), int)
