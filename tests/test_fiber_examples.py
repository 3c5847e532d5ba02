"""The examples of Fiber's documentation and repository run on fiberrl with only the import changed.

Each program is in examples/fiber_docs/, copied from github.com/uber/fiber
(its docstring names the file or documentation section, and any change besides
the import: a size taken from the command line, gymnasium for gym).  Every test
runs one as a real script in a fresh interpreter, as a user would, checks that
it exits 0, that what it prints is right, and that no process it started
outlives it (the scripts, like Fiber's, leave pools and managers to be cleaned
up at exit).
"""
import math
import os
import re

import numpy as np
import pytest

from conftest import ROOT
from helpers.script_runs import run_script

pytestmark = pytest.mark.slow  # the tests here start processes

EXAMPLES = os.path.join(ROOT, "examples", "fiber_docs")


def run_example(name: str, env: dict, *args: str) -> str:
    """Run examples/fiber_docs/<name>.py; return its stdout."""
    return run_script(os.path.join(EXAMPLES, name + ".py"), env, *args).out


def test_hello_fiber(script_env):
    """Getting Started's minimal example: a Process printing 'Hello, Fiber!', started and never joined,
    prints before the program ends, as the main process waits for its children at exit."""
    assert run_example("hello_fiber", script_env) == "Hello, Fiber!\n"


def test_basic_process(script_env):
    """examples/basic_process.py: Process(target=f, args=('Fiber',)), start, join."""
    assert run_example("basic_process", script_env) == "Hello Fiber\nDone\n"


def test_basic_queue(script_env):
    """examples/basic_queue.py: a child puts 42 + 21 on a SimpleQueue the parent reads."""
    assert run_example("basic_queue", script_env) == "63\n"


def parse_pi(out: str) -> float:
    match = re.fullmatch(r"Pi is roughly (\S+)\n", out)
    assert match, out
    return float(match.group(1))


def test_pi_estimation(script_env):
    """Getting Started's Pi estimation (examples/pi_estimation.py): Pool(processes=4).map of a
    sampling function over 100,000 points estimates pi (its standard error is 0.005)."""
    assert abs(parse_pi(run_example("pi_estimation", script_env, "100000")) - math.pi) < 0.1


def test_readme_pi_estimation(script_env):
    """The README's Pi estimation: fiber.Pool(processes=4).map of a function declared
    @fiber.meta(cpu=1)."""
    assert abs(parse_pi(run_example("readme_pi_estimation", script_env, "100000")) - math.pi) < 0.1


def test_pi_estimation_with_resource_limits(script_env):
    """Getting Started's 'Resource Limits': the Pi estimation with is_inside declared
    @fiber.meta(cpu=1, memory=1000)."""
    assert abs(parse_pi(run_example("pi_estimation_meta", script_env, "100000")) - math.pi) < 0.1


# What examples/shared_data.py prints when run with multiprocessing (a proxy's repr, which names
# an address or id, is written <ListProxy>): the child's changes reach what is managed and assigned
# back, not the unmanaged lists it changed in place.
SHARED_DATA_OUTPUT = """\
before
Namespace(x=1, y=[1], z=[1])
[1, [1], [1], <ListProxy>]
[1]
{0: 1, 1: [1], 2: [1], 3: <ListProxy>}
[1]
after
Namespace(x=2, y=[1], z=[2])
[2, [1], [2], <ListProxy>]
[2]
{0: 2, 1: [1], 2: [2], 3: <ListProxy>}
[2]
7
56
"""


def test_shared_data(script_env):
    """examples/shared_data.py: a child changes a Manager's Namespace, list and dict (some items
    managed, some not, some assigned back); then a BaseManager subclass serves a registered class.
    It prints what it prints with multiprocessing."""
    out = run_example("shared_data", script_env)
    assert re.sub(r"<ListProxy[^>]*>", "<ListProxy>", out) == SHARED_DATA_OUTPUT


def test_line_count(script_env, tmp_path):
    """examples/line_count.py: Pool(4).map counts the lines of every *.py file of a directory
    (generated here: empty files, a last line without a newline, more files than workers; a
    .txt file and a subdirectory's file that the glob leaves out); each count is the real one."""
    rng = np.random.default_rng(0)
    for i in range(11):
        n = int(rng.integers(0, 400)) if i else 0
        text = "".join(f"line {j} of file {i}\n" for j in range(n))
        if i % 3 == 1:
            text += "no newline at the end"
        (tmp_path / f"file_{i:02d}.py").write_text(text)
    (tmp_path / "notes.txt").write_text("not\ncounted\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deeper.py").write_text("not\ncounted\n")

    expected = []
    for path in sorted(tmp_path.glob("*.py")):
        data = path.read_bytes()
        lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        expected.append(f"{path}\t{lines}")
    assert len(expected) == 11
    assert run_example("line_count", script_env, str(tmp_path)).splitlines() == expected


def test_parzen_estimation(script_env):
    """examples/parzen_estimation.py: Pool(4).apply_async of a Parzen-window density estimate at
    the origin for 102 window widths over 1,000 seeded 2-D Gaussian samples; the results come
    back sorted by width and equal the estimate computed here with numpy at once."""
    n = 1000
    out = run_example("parzen_estimation", script_env, str(n))

    np.random.seed(123)
    samples = np.random.multivariate_normal(np.array([0, 0]), np.array([[1, 0], [0, 1]]), n)
    widths = np.arange(0.1, 10.3, 0.1)
    lines = out.splitlines()
    assert len(lines) == len(widths) == 102
    for line, h in zip(lines, widths):
        match = re.fullmatch(r"h = (\S+), p\(x\) = (\S+)", line)
        assert match, line
        inside = np.all(np.abs((0 - samples) / h) <= 0.5, axis=1).sum()
        # Fiber's program divides by h ** point_x.shape[1], and its point has shape (2, 1)
        assert float(match.group(1)) == h
        assert math.isclose(float(match.group(2)), (inside / n) / h, rel_tol=1e-12, abs_tol=1e-15), line
    assert float(lines[-1].split(",")[1].split("=")[1]) > 0


def test_async_manager(script_env):
    """examples/async_manager.py: 4 SyncManagers, then 4 AsyncManagers, each holding a CartPole-v1
    (gymnasium) env, step their envs 300 times, resetting those that end; both report their time."""
    out = run_example("async_manager", script_env, "300")
    assert re.fullmatch(r"Sync manager took \d+\.\d+(e-?\d+)?s\nAsync manager took \d+\.\d+(e-?\d+)?s\n", out), out


def test_async_manager_calculator(script_env):
    """The AsyncManager example of Fiber's Managers page: calc.add(10, 32) on a registered class
    returns a handle at once, and handle.get() gives 42."""
    out = run_example("async_manager_calculator", script_env)
    first, second = out.splitlines()
    assert re.fullmatch(r"<class '[\w.]+'>", first) and second == "42", out
