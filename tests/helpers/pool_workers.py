"""A running pool's workers as its own records show them, for tests that stop or kill one."""
from conftest import wait_until


def worker_running_a_chunk(pool, timeout: float = 60):
    """The process of a worker that said it started a chunk it still runs (waiting up to ``timeout`` s)."""
    scheduler = pool._scheduler

    def find():
        with scheduler.lock:
            return next((w.process for w in scheduler.policy.workers.values()
                         if w.inflight and w.inflight[0].id == w.running), None)
    assert wait_until(lambda: find() is not None, timeout)
    return find()


def workers_taking_work(pool) -> list[int]:
    """The pids of the connected workers not on their way out."""
    with pool._scheduler.lock:
        return [w.process.pid for w in pool._scheduler.policy.workers.values()
                if w.stream_id is not None and not w.retiring]
