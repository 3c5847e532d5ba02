"""What POET's pool workers run: ES's evaluator (``algos.es_workers``) on the
terrain each task names, with the agents the master published together under
one version, and the worker's own time on each task, for the busy share the
run reports."""
from __future__ import annotations

import time
from typing import NamedTuple

from fiberrl.rl.walker_terrain import make_terrain_env

from . import es_workers
from .es_workers import EvalResult, EvalTask, EvaluatorSpec, PairResult, PairTask


class TerrainTask(NamedTuple):
    """An ES task (``PairTask`` or ``EvalTask``) for the agent published under ``agent``, on ``terrain``."""
    agent: object
    terrain: dict              # a TerrainEncoding's fields
    task: PairTask | EvalTask


class TerrainResult(NamedTuple):
    result: PairResult | EvalResult
    seconds: float             # the worker's time on the task, for the busy share in reports


class Evaluator(es_workers.Evaluator):
    """One per worker: ES's evaluator on the terrain each task names, with the agents published together."""

    def __init__(self, spec: EvaluatorSpec, store):
        self.agents = {}
        super().__init__(spec, store)

    def _make_env(self, terrain: dict | None = None):
        return make_terrain_env(terrain, self.spec.env_steps)  # fresh per task: a Box2D world keeps state

    def __call__(self, task: TerrainTask) -> TerrainResult:
        began = time.perf_counter()
        if task.task.version != self.version:
            self.agents, self.version = self.store.fetch(task.task.version), task.task.version
        env = self._make_env(task.terrain)
        try:
            return TerrainResult(self.run(task.task, env, *self.agents[task.agent]), time.perf_counter() - began)
        finally:
            env.close()


_evaluator: Evaluator | None = None


def init_worker(spec: EvaluatorSpec, store) -> None:
    global _evaluator
    _evaluator = Evaluator(spec, store)


def evaluate(task: TerrainTask) -> TerrainResult:
    return _evaluator(task)
