"""What the tests use and that is no test: imported as ``helpers.<module>`` (pytest puts
``tests/`` on ``sys.path``, and the jobs a test starts get that path too).

* ``docker_backend``, ``kubernetes_backend``, ``slurm_backend``: for each cluster backend, whether
  it can run here, the settings that aim the runtime at it, how a user would kill one of its jobs,
  and which of its jobs are left (the conformance suite imports them by name:
  ``helpers.<backend>_backend``);
* ``k8s_standin``: the stand-in Kubernetes API server the kubernetes backend is tested against;
* ``ppo_toy_env``: gymnasium envs whose values are known, as ``helpers.ppo_toy_env:Chain-v0``;
* ``script_runs``: running a program in a fresh interpreter as a user would;
* ``long_sleeps/``: not a module: a ``sitecustomize`` that a test puts on a program's PYTHONPATH
  to see whether its long ``time.sleep`` calls ended or were cut short.
"""
