"""PB2's explore (Parker-Holder et al. 2020, "Provably Efficient Online Hyperparameter Optimization with
Population-Based Bandits", arXiv:2002.02518): a copy's settings chosen where a Gaussian process expects
the most improvement, instead of its donor's perturbed at random.

Each segment that has ended is one observation: the env steps it ended at, the score it began from, its
settings (each scaled to [0, 1] in its space, log-scaled where the space is), and how much its score changed
per env step. The process has Bogunovic et al.'s time-varying kernel (a squared exponential over score and
settings, times ``(1 - epsilon) ** (|t - t'| / 2)``: older observations count for less), its hyperparameters
and the observations' noise fitted by their marginal likelihood. The settings chosen maximise the upper
confidence bound of the change from the copied checkpoint's score over the next interval; those other members
already run with shrink the bound's width where they are (Desautels et al.'s batch rule), so members ready
together spread out. The bound is maximised within ``radius`` (a share of each space) of the donor's own
settings, as BG-PBT (Wan et al. 2022, arXiv:2207.09405) keeps its search in a trust region: where the
process knows little, the bound is highest far from every observation, and members that all began at one
point would send each copy to the space's opposite corner (a learning rate of 1e-5 and the largest entropy
bonus, seen on PPO); ``radius=1`` searches the whole space, as PB2 does. Every random draw comes from the
generator the caller passes: a generational sweep chooses the same settings again.

Its authors built it for small populations, whose few members cannot cover a space by chance. It wants
observations spread over the space: from one poor start for every member, PPO on BipedalWalker did far worse
under it than under random perturbations (docs/benchmarks.md, "PB2's explore")."""

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

# fewer observations than this fit no process worth trusting: the donor's settings are perturbed as PBT does
MIN_OBSERVATIONS = 3
STARTS = 10  # random starts of the acquisition's maximisation (PB2's)
# log bounds of the kernel's variance, lengthscale and epsilon, and of the observations' noise (the changes
# are standardised, so a noise of 1 says they hold nothing but noise)
BOUNDS = np.log([(1e-3, 1e2), (1e-3, 1e2), (1e-5, 0.5), (1e-4, 1.0)])


@dataclass(frozen=True)
class Observation:
    timesteps: float        # env steps at the segment's end
    before: float           # the score it began from
    unit: tuple             # its settings, each in [0, 1] of its space
    change: float           # its score's change per env step (better is larger)


def suggest(observations: list[Observation], timesteps: float, before: float, running: list[tuple],
            around: tuple, radius: float, rng: np.random.Generator) -> tuple[Optional[np.ndarray], dict]:
    """The settings in [0, 1] (one per dimension of the observations' ``unit``), within ``radius`` of ``around``
    (the donor's), with the highest upper confidence bound of the change from score ``before`` in a segment
    ending at ``timesteps``, given the settings other members run with now (``running``), and what the process
    said of them (``observations``, its predicted ``mean`` and ``std`` of the standardised change). No settings
    where the process chooses none, and ``fallback`` says why: too few observations, all alike, or a kernel
    matrix that would not factor."""
    seen = {"observations": len(observations)}
    if len(observations) < MIN_OBSERVATIONS:
        return None, {**seen, "fallback": f"{len(observations)} segments ended, fewer than {MIN_OBSERVATIONS}"}
    fixed = np.array([[o.timesteps, o.before] for o in observations], dtype=float)
    change = np.array([o.change for o in observations], dtype=float)
    if np.ptp(change) == 0:
        return None, {**seen, "fallback": "every segment's score changed alike"}
    low, span = fixed.min(axis=0), np.where(np.ptp(fixed, axis=0) > 0, np.ptp(fixed, axis=0), 1.0)
    x = np.hstack([(fixed - low) / span, np.array([o.unit for o in observations], dtype=float)])
    # standardised and clipped as PB2's: one run's leap does not flatten every other difference
    y = np.clip((change - change.mean()) / change.std(), -2.0, 2.0)
    theta = _fit(x, y, rng)
    at = (np.array([timesteps, before]) - low) / span
    pending = np.array([np.concatenate([at, u]) for u in running], dtype=float).reshape(-1, x.shape[1])
    try:
        model = _Posterior(x, y, theta)
        widths = _Posterior(np.vstack([x, pending]), np.concatenate([y, np.zeros(len(pending))]), theta) \
            if len(pending) else model
    except np.linalg.LinAlgError:  # not positive definite even with the fitted noise: perturbed instead
        return None, {**seen, "fallback": "the kernel matrix was not positive definite"}
    kappa = math.sqrt(0.2 + max(0.0, math.log(0.4 * len(x))))  # GP-UCB's beta_t as PB2 sets it

    def negative_bound(u):
        point = np.concatenate([at, u])[None, :]
        return -(model.mean(point)[0] + kappa * widths.std(point)[0])

    from scipy.optimize import minimize  # only a sweep that explores by PB2 needs it
    centre = np.asarray(around, dtype=float)
    floor, ceiling = np.clip(centre - radius, 0.0, 1.0), np.clip(centre + radius, 0.0, 1.0)
    best, best_value = None, math.inf
    for _ in range(STARTS):
        found = minimize(negative_bound, rng.uniform(floor, ceiling), method="L-BFGS-B",
                         bounds=list(zip(floor, ceiling)), options={"maxiter": 200})
        if found.fun < best_value:
            best, best_value = np.clip(found.x, floor, ceiling), found.fun
    point = np.concatenate([at, best])[None, :]
    return best, {**seen, "mean": float(model.mean(point)[0]), "std": float(model.std(point)[0])}


def kernel(a: np.ndarray, b: np.ndarray, variance: float, lengthscale: float, epsilon: float) -> np.ndarray:
    """Bogunovic et al.'s time-varying squared exponential: column 0 is time, the rest are compared by distance."""
    elapsed = np.abs(a[:, None, 0] - b[None, :, 0])
    apart = np.square(a[:, None, 1:] - b[None, :, 1:]).sum(axis=-1)
    return variance * np.exp(-apart / lengthscale) * (1.0 - epsilon) ** (0.5 * elapsed)


class _Posterior:
    def __init__(self, x: np.ndarray, y: np.ndarray, theta: np.ndarray):
        variance, lengthscale, epsilon, noise = np.exp(theta)
        self.x, self.params = x, (variance, lengthscale, epsilon)
        self.factor = np.linalg.cholesky(kernel(x, x, *self.params) + (noise + 1e-8) * np.eye(len(x)))
        self.alpha = np.linalg.solve(self.factor.T, np.linalg.solve(self.factor, y))

    def mean(self, points: np.ndarray) -> np.ndarray:
        return kernel(points, self.x, *self.params) @ self.alpha

    def std(self, points: np.ndarray) -> np.ndarray:
        v = np.linalg.solve(self.factor, kernel(self.x, points, *self.params))
        return np.sqrt(np.maximum(self.params[0] - np.square(v).sum(axis=0), 0.0))


def negative_log_likelihood(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    try:
        posterior = _Posterior(x, y, theta)
    except np.linalg.LinAlgError:
        return 1e10
    return float(0.5 * y @ posterior.alpha + np.log(np.diag(posterior.factor)).sum()
                 + 0.5 * len(x) * math.log(2 * math.pi))


def _fit(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The kernel's log hyperparameters and log noise of the highest marginal likelihood: from PB2's start
    (variance 1, lengthscale 1, epsilon 0.1) and from two drawn in the bounds."""
    from scipy.optimize import minimize
    starts = [np.log([1.0, 1.0, 0.1, 0.1])] + [rng.uniform(BOUNDS[:, 0], BOUNDS[:, 1]) for _ in range(2)]
    best, best_value = starts[0], math.inf
    for start in starts:
        found = minimize(negative_log_likelihood, start, args=(x, y), method="L-BFGS-B",
                         bounds=list(map(tuple, BOUNDS)))
        if found.fun < best_value:
            best, best_value = found.x, found.fun
    return best
