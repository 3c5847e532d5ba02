"""The ready-made algorithms, one readable file each.

Each module ends with its ``ALGORITHM`` record (``fiberrl.algorithm.Algorithm``):
its ``Config`` (the hyperparameters, also the Hydra schema of ``algo=<name>``),
``train(cfg, run)``, and what else the app needs to know of it;
``fiberrl.algorithm.ALGORITHMS`` names them.
"""
