"""The ready-made algorithms, one readable file each.

Each module ends with its ``ALGORITHM`` record (``fiberrl.algorithm.Algorithm``):
its ``Config`` (the hyperparameters, also the Hydra schema of ``algo=<name>``),
``train(cfg, run)``, and what else the app needs to know of it.  A module is
imported only when its algorithm is asked for (PPO's imports torch).
"""
from __future__ import annotations

import importlib

ALGORITHMS = {"es": "algos.es", "ppo": "algos.ppo", "poet": "algos.poet"}


def algorithm(name: str):
    """The ``Algorithm`` record of ``algo=<name>``."""
    return importlib.import_module(ALGORITHMS[name]).ALGORITHM
