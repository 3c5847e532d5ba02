"""@meta(cpu=, gpu=, mem=) reaches the JobSpec; locally gpu sets CUDA_VISIBLE_DEVICES."""
import os
import time

import pytest

import fiberrl.runtime as mp
from conftest import hand_out_gpus


@mp.meta(gpu=1, cpu=2, mem=512)
def report_devices(q):
    q.put(os.environ.get("CUDA_VISIBLE_DEVICES"))
    time.sleep(0.5)


@mp.meta(gpu=5)
def greedy():
    pass


@pytest.fixture
def two_gpus(monkeypatch):
    hand_out_gpus(monkeypatch, "0,1")


@pytest.mark.slow
def test_meta_recorded_in_jobspec_and_gpus_spread(two_gpus):
    q = mp.Queue()
    procs = [mp.Process(target=report_devices, args=(q,)) for _ in range(2)]
    for p in procs:
        p.start()
    spec = procs[0]._job.spec
    assert (spec.cpu, spec.gpu, spec.mem) == (2, 1, 512)
    seen = sorted(q.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(30)
    assert seen == ["0", "1"]  # one device each, not both on the first


@pytest.mark.slow
def test_more_gpus_than_visible_is_a_clear_error(two_gpus):
    with pytest.raises(ValueError, match=r"meta\(gpu=5\) asks for more GPUs than this machine shows \(2"):
        mp.Process(target=greedy).start()
    assert mp.active_children() == []


def test_bad_meta_values():
    with pytest.raises(ValueError, match="gpu=1.5"):
        mp.meta(gpu=1.5)
    with pytest.raises(ValueError, match="cpu=-1"):
        mp.meta(cpu=-1)


@pytest.mark.slow
def test_meta_through_subclass_run():
    class Worker(mp.Process):
        @mp.meta(cpu=3)
        def run(self):
            pass
    w = Worker()
    w.start()
    assert w._job.spec.cpu == 3
    w.join(30)


def test_memory_is_fibers_name_for_mem():
    from fiberrl.runtime.meta import resources_of

    @mp.meta(cpu=1, memory=1000)
    def as_fiber_writes_it():
        pass

    assert resources_of(as_fiber_writes_it) == {"cpu": 1, "mem": 1000}
    with pytest.raises(ValueError, match="mem= or memory="):
        mp.meta(mem=1, memory=2)
