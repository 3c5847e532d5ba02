"""The PBT sweeper's settings, ``hydra.sweeper.*`` (``hydra/sweeper=pbt``)."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class PBTSweeperConf:
    _target_: str = "hydra_plugins.fiberrl_pbt.sweeper.PBTSweeper"
    population: int = 4               # members, training at the same time (as the launcher fits them)
    interval: int = 100_000           # env steps between a member's ready points
    burn_in: int = 0                  # env steps before a member may exploit another
    # what ranks members: a metric of the algorithm's metrics.jsonl, its mean over a member's last
    # `window` values, and whether more (max) or less (min) is better
    metric: str = "eval_reward"
    mode: str = "max"
    window: int = 3
    # how a ready member chooses whom to copy (Jaderberg et al.'s two rules): "truncation", in the bottom quantile
    # it copies one of the top quantile; "ttest", it copies another member drawn at random when Welch's t-test
    # on their last `window` values says that member is better at `significance`
    selection: str = "truncation"
    quantile: float = 0.25
    # whom a ready member is ranked against: "now", the others as they are now (their latest values, their newest
    # checkpoints: Jaderberg et al.'s); "ready", each as it stood at its own last ready point past the burn-in, a top
    # member copied only from a ready point at which it ranked in the top quantile, else the exploit skipped (Ray
    # Tune's rules)
    ranking: str = "now"
    significance: float = 0.05
    # the mutations, as Hydra's sweepers take their search spaces: setting -> a space in sweep syntax
    # ("tag(log, interval(1e-5, 1e-2))", "choice(0.9, 0.95)", "range(1, 11)") or {space: ..., resample: p,
    # factors: [..]}; a sweep override on the command line (algo.clip_coef='interval(0.1,0.3)') is one too.
    # None of either: the algorithm's usual set (fiberrl.algorithm.Algorithm.mutations)
    params: Dict[str, Any] = field(default_factory=dict)
    # how a copy's settings are explored: "perturb", its donor's perturbed or resampled (Jaderberg et al.'s, Ray Tune's
    # PopulationBasedTraining); "pb2", the intervals' chosen where a Gaussian process fitted to every segment so far
    # expects the most improvement (Parker-Holder et al.'s PB2; choices are still perturbed)
    explore: str = "perturb"
    # with explore=pb2: how far from the donor's settings, as a share of each space (log-scaled where it is), the
    # process looks; 1: the whole space, as PB2 does
    pb2_radius: float = 0.25
    resample_probability: float = 0.25  # an explored setting is resampled from its space, else perturbed
    perturb_factors: List[float] = field(default_factory=lambda: [0.8, 1.2])
    sample_initial: bool = False      # members start at values sampled from the spaces, not the config's
    synchronous: bool = False         # generational: every member waits for the others at each interval
    seed: Optional[int] = None        # of PBT's own choices; None: the config's seed
    # the final selection: once every member has finished, each one's final policy runs this many episodes
    # (episode i reset with seed final_seed + i, the same for all) and the best mean return names the sweep's best
    # member; 0: the best by the ranking metric, as it stood at the end
    final_episodes: int = 0
    final_seed: int = 1_000_000


ConfigStore.instance().store(group="hydra/sweeper", name="pbt", node=PBTSweeperConf, provider="fiberrl")
