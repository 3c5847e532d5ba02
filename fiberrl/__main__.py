"""``python -m fiberrl algo=es env=cartpole workers=8 seed=0 [algo.sigma=0.05 ...]``
(``-m`` sweeps: ``python -m fiberrl -m seed=0,1,2 algo.sigma=0.02,0.05``)."""
import sys

import hydra
from hydra.core.hydra_config import HydraConfig

from fiberrl.app import run_or_exit
from fiberrl.config import CONFIG_DIR, register_configs, register_resolvers

register_resolvers()
register_configs(sys.argv[1:])


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")
def main(cfg):
    """Returns the run's best eval reward, the objective a sweeper (Optuna, Nevergrad, PBT) reads."""
    summary = run_or_exit(cfg, HydraConfig.get().runtime.output_dir)
    return summary.get("best_eval_reward")


if __name__ == "__main__":
    main()
