"""Ring: equal peers on job-backed processes, rendezvous through torch.distributed."""
import datetime
import os
import signal
import socket
import subprocess
import time

import pytest

import fiberrl.runtime as mp
from conftest import PYTHON, hand_out_gpus, pid_alive, wait_until
from fiberrl.runtime.pool.results import RemoteTraceback
from fiberrl.runtime.primitives.ring import Ring, RingError, _listen

SEEN = {}  # what this member's initializer saw; each member is its own process


def record_node(node, tag):
    seen = dict(tag=tag, rank=node.rank, size=node.size, addr=node.master_addr, port=node.master_port,
                members=[(m.rank, m.ip, m.port, m.connected) for m in node.members], pid=os.getpid())
    if node.rank == 0:
        # the advertised port is free: torch, started however the user likes, can bind it
        probe = socket.socket()
        try:
            probe.bind((node.master_addr, node.master_port))
            seen["free"] = True
        except OSError:
            seen["free"] = False
        finally:
            probe.close()
    SEEN.update(seen)


def report_seen(rank, size):
    return dict(SEEN, func_rank=rank, func_size=size, func_pid=os.getpid())


@pytest.mark.slow
def test_node_knows_its_place_and_the_rendezvous_port_is_free_to_bind():
    seen = Ring(3, report_seen, record_node, initargs=("tagged",)).run()
    assert [s["rank"] for s in seen] == [s["func_rank"] for s in seen] == [0, 1, 2]
    assert {s["size"] for s in seen} == {s["func_size"] for s in seen} == {3}
    assert all(s["tag"] == "tagged" for s in seen) and seen[0]["free"]
    addr, port = seen[0]["addr"], seen[0]["port"]
    assert addr == "127.0.0.1" and 0 < port < 65536
    assert all((s["addr"], s["port"]) == (addr, port) for s in seen)
    assert all(s["members"] == [(0, addr, port, True), (1, addr, None, True), (2, addr, None, True)] for s in seen)
    pids = {s["pid"] for s in seen}
    assert len(pids) == 3 and os.getpid() not in pids  # rank 0 is a member job too
    assert all(s["pid"] == s["func_pid"] for s in seen)


def ring_init(node):
    node.init_process_group(timeout=60)


def linear_regression_sgd(rank, size, steps=40, lr=0.1):
    import torch
    import torch.distributed as dist

    assert dist.get_rank() == rank and dist.get_world_size() == size and dist.get_backend() == "gloo"
    true_w = torch.tensor([2.0, -3.0, 0.5])
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the data
    x = torch.randn(64, 3, generator=g)
    y = x @ true_w + 1.0 + 0.01 * torch.randn(64, generator=g)
    torch.manual_seed(0)  # identical initial parameters everywhere
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= size
        opt.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return params.numpy(), losses


@pytest.mark.slow
def test_distributed_sgd_with_gloo():
    import numpy as np
    results = Ring(3, linear_regression_sgd, ring_init).run()
    assert len(results) == 3
    params = [p for p, _ in results]
    for p in params[1:]:
        np.testing.assert_array_equal(p, params[0])
    for _, losses in results:
        assert losses[-1] < 0.1 * losses[0]
    np.testing.assert_allclose(params[0], [2.0, -3.0, 0.5, 1.0], atol=0.3)


def env_style_init(node):
    """Fiber's examples/ring.py: MASTER_ADDR/MASTER_PORT from members[0], then
    env:// rendezvous, with nothing fiberrl-specific in between."""
    import torch.distributed as dist
    from fiberrl.runtime.backends import get_backend
    master = node.members[0]
    assert master.connected and (master.ip, master.port) == (node.master_addr, node.master_port)
    _, _, interface = get_backend().get_listen_addr()
    os.environ["MASTER_ADDR"] = master.ip
    os.environ["MASTER_PORT"] = str(master.port)
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    dist.init_process_group("gloo", rank=node.rank, world_size=node.size, timeout=datetime.timedelta(seconds=60))


def release_port_init(node):
    """Initializers written against release_port() keep working."""
    import torch.distributed as dist
    node.release_port()
    dist.init_process_group("gloo", rank=node.rank, world_size=node.size, timeout=datetime.timedelta(seconds=60))


def sum_ranks(rank, size):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


@pytest.mark.slow
def test_env_style_initializer():
    assert Ring(2, sum_ranks, env_style_init).run() == [3.0, 3.0]


@pytest.mark.slow
def test_release_port_initializer():
    assert Ring(2, sum_ranks, release_port_init).run() == [3.0, 3.0]


TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_script(rank, size):
    """A function written for torchrun: everything from the environment."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {name: os.environ[name] for name in TORCHRUN_NAMES}, t.item()


@pytest.mark.slow
def test_members_carry_torchruns_environment():
    results = Ring(3, torchrun_script).run()
    assert [total for _, total in results] == [6.0] * 3
    envs = [env for env, _ in results]
    assert [(e["RANK"], e["LOCAL_RANK"]) for e in envs] == [("0", "0"), ("1", "1"), ("2", "2")]
    assert all(e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "3" for e in envs)  # one host
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1


def test_local_rank_counts_members_on_the_same_host():
    from fiberrl.runtime.primitives.ring import RingMember, _torchrun_env
    members = [RingMember(0, "10.0.0.1", 20000), RingMember(1, "10.0.0.2", None),
               RingMember(2, "10.0.0.1", None), RingMember(3, "10.0.0.2", None)]
    envs = [_torchrun_env(rank, members) for rank in range(4)]
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [("0", "2"), ("0", "2"), ("1", "2"), ("1", "2")]
    assert all((e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) == ("10.0.0.1", "20000", "4") for e in envs)


def test_local_backend_listen_addr_is_fibers():
    from fiberrl.runtime.backends import get_backend
    assert get_backend("local").get_listen_addr() == ("127.0.0.1", 0, "lo")


@pytest.mark.slow
def test_fibers_ring_example_runs_with_only_the_import_changed(script_env, tmp_path):
    """examples/fiber_ring.py: Fiber's examples/ring.py on synthetic data."""
    from conftest import ROOT
    script = os.path.join(ROOT, "examples", "fiber_ring.py")
    out = subprocess.run([PYTHON, script], env=script_env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    # the two ranks print at once, and their words may interleave: count them
    assert out.stdout.count("pytorch ring init, rank") == 2
    assert out.stdout.count("epoch") == 4 and out.stdout.count("Rank") == 4


def test_rendezvous_port_lies_below_the_ephemeral_range():
    """The advertised port is unheld until torch binds it: it
    must not be one the kernel could give a connection meanwhile (above all a
    member's own connect retried against it, which would then hold it)."""
    from fiberrl.runtime.primitives.ring import _ephemeral_low
    low = _ephemeral_low()
    listeners = [_listen("127.0.0.1", 1) for _ in range(20)]
    try:
        ports = {s.getsockname()[1] for s in listeners}
        assert len(ports) == 20 and all(10000 <= p < low for p in ports)
    finally:
        for s in listeners:
            s.close()


class Boom(Exception):
    pass


def fail_on_rank_one(rank, size):
    if rank == 1:
        raise Boom("rank one gives up")
    time.sleep(60)  # the others would wait for long: run() must stop them


@pytest.mark.slow
def test_member_that_raises_names_its_rank_and_stops_the_others():
    start = time.monotonic()
    with pytest.raises(RingError, match=r"rank 1 failed: .*Boom: rank one gives up") as info:
        Ring(3, fail_on_rank_one).run()
    assert time.monotonic() - start < 15
    assert info.value.rank == 1
    cause = info.value.__cause__
    assert isinstance(cause, Boom) and str(cause) == "rank one gives up"
    assert isinstance(cause.__cause__, RemoteTraceback) and "fail_on_rank_one" in str(cause.__cause__)
    assert mp.active_children() == []


def failing_init(node, message):
    if node.rank == 2:
        raise ValueError(message)
    node.init_process_group(timeout=60)  # waits for rank 2, which never comes


@pytest.mark.slow
def test_initializer_that_raises():
    with pytest.raises(RingError, match=r"rank 2 failed: ValueError: no rendezvous for me"):
        Ring(3, sum_ranks, failing_init, initargs=("no rendezvous for me",)).run()
    assert mp.active_children() == []


def die_in_collective(rank, size):
    import torch.distributed as dist
    if rank == size - 1:
        time.sleep(0.5)
        os._exit(3)
    dist.barrier()  # never completes: the last member is gone


@pytest.mark.slow
def test_member_that_dies_while_others_wait_in_a_collective():
    ring = Ring(3, die_in_collective, ring_init)
    start = time.monotonic()
    with pytest.raises(RingError, match=r"rank 2 exited with code 3") as info:
        ring.run()
    assert time.monotonic() - start < 15
    assert info.value.rank == 2
    assert mp.active_children() == []


def pid_then_sleep(rank, size, pids):
    pids.put((rank, os.getpid()))
    time.sleep(60)


@pytest.mark.slow
def test_member_killed_from_outside_is_detected_promptly():
    pids = mp.Queue()
    ring = Ring(2, lambda rank, size: pid_then_sleep(rank, size, pids))
    import threading
    outcome = {}

    def run():
        try:
            ring.run()
        except RingError as exc:
            outcome["error"] = exc, time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    got = dict(pids.get(timeout=30) for _ in range(2))
    killed_at = time.monotonic()
    os.kill(got[0], signal.SIGKILL)
    thread.join(30)
    error, noticed_at = outcome["error"]
    assert error.rank == 0 and "exited with code -9 (killed by SIGKILL)" in str(error)
    assert noticed_at - killed_at < 1.5
    assert not pid_alive(got[1]) or wait_until(lambda: not pid_alive(got[1]), 5)
    assert mp.active_children() == []


def unpicklable_result(rank, size):
    import threading
    return threading.Lock() if rank == 1 else rank


@pytest.mark.slow
def test_unpicklable_result_names_the_rank():
    with pytest.raises(RingError, match=r"rank 1 failed: TypeError: rank 1's return value cannot be pickled"):
        Ring(2, unpicklable_result).run()


@pytest.mark.slow
def test_results_in_rank_order_and_runs_once():
    ring = Ring(4, lambda rank, size: (rank, size))
    assert ring.run() == [(0, 4), (1, 4), (2, 4), (3, 4)]
    with pytest.raises(RuntimeError, match="runs once"):
        ring.run()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_process_count(bad):
    with pytest.raises(ValueError, match="processes"):
        Ring(bad, print)


def test_bad_func_and_initializer():
    with pytest.raises(ValueError, match="func"):
        Ring(2, "not callable")
    with pytest.raises(ValueError, match="initializer"):
        Ring(2, print, initializer=42)


@mp.meta(cpu=1.5, mem=256)
def with_resources(rank, size):
    return rank


@pytest.mark.slow
def test_members_carry_the_meta_resources(monkeypatch):
    from fiberrl.runtime.backends.local import LocalBackend
    specs = []
    create_job = LocalBackend.create_job

    def recording(self, spec):
        specs.append(spec)
        return create_job(self, spec)

    monkeypatch.setattr(LocalBackend, "create_job", recording)
    assert Ring(2, with_resources).run() == [0, 1]
    assert [(s.cpu, s.mem, s.gpu) for s in specs] == [(1.5, 256, None)] * 2


def _cuda_gpus() -> int:
    import torch
    return torch.cuda.device_count()


needs_a_gpu = pytest.mark.skipif(_cuda_gpus() == 0, reason="needs a CUDA GPU: nccl runs on GPUs only")


@pytest.fixture
def one_gpu(monkeypatch):
    """Members with meta(gpu=1) share the one GPU the local backend hands out."""
    hand_out_gpus(monkeypatch, "0")


def nccl_init(node):
    node.init_process_group()


@mp.meta(gpu=1)
def sum_ranks_on_the_gpu(rank, size):
    import torch
    import torch.distributed as dist
    t = torch.full((4,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    return dist.get_backend(), os.environ.get("CUDA_VISIBLE_DEVICES"), t.sum().item()


@pytest.mark.slow
@needs_a_gpu
def test_a_member_with_meta_gpu_is_given_a_gpu_and_reduces_over_nccl(one_gpu):
    assert Ring(1, sum_ranks_on_the_gpu, nccl_init).run() == [("nccl", "0", 4.0)]


@pytest.mark.slow
@needs_a_gpu
def test_members_that_share_a_gpu_are_told_so_in_one_line_not_by_nccls_page(one_gpu):
    with pytest.raises(RingError, match=r"ranks 0 and 1 share GPU \S+ on \S+, and NCCL needs a GPU per rank: run at "
                                        r"most as many members per machine as it has GPUs, or init_process_group"):
        Ring(2, sum_ranks_on_the_gpu, nccl_init).run()


@pytest.mark.slow
def test_importing_ring_does_not_import_torch(script_env):
    code = "import sys, fiberrl.runtime.primitives.ring; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([PYTHON, "-c", code], env=script_env, check=True, timeout=60)
