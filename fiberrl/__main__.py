"""``python -m fiberrl algo=es env=cartpole workers=8 seed=0 [algo.sigma=0.05 ...]``
(``-m`` sweeps: ``python -m fiberrl -m seed=0,1,2 algo.sigma=0.02,0.05``)."""
import sys

import hydra

from fiberrl.app import task
from fiberrl.app_config import CONFIG_DIR, register_configs, register_resolvers

register_resolvers()
register_configs(sys.argv[1:])

# task lives in fiberrl.app: a sweep's run jobs import it from there (a package's __main__ is not importable)
main = hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")(task)


if __name__ == "__main__":
    main()
