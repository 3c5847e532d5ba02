"""The ready-made algorithms, one readable file each.

Each module defines ``Config`` (its hyperparameters, also its Hydra schema
for ``algo=<name>``) and ``train(cfg, run)``.
"""
ALGORITHMS = {"es": "algos.es", "ppo": "algos.ppo", "poet": "algos.poet"}
