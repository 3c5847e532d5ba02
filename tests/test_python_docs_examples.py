"""The programs of Python's multiprocessing documentation run on fiberrl with only the import changed.

Each program is in examples/python_docs/, copied from CPython's
Doc/library/multiprocessing.rst (and the Doc/includes/mp_*.py files its
Examples section includes); its docstring names the section, and any change
besides the import.  Every test runs one as a real script in a fresh
interpreter, as a user would, checks its exit status, that what it prints is
what the docs say (or, where they say nothing, what the same program prints
with ``multiprocessing``; pids, ports, worker names and timing-dependent
orders normalised), that it writes nothing on stderr, and that no process it
started outlives it.

The docs' snippets that are no complete program (interactive sessions other
than the logging one, fragments with ``...``), the remote-manager sessions
(a server that serves forever, clients on another host), the program that
deadlocks on purpose and the one that fails on purpose (a main module without
``if __name__ == '__main__':``) have no script here.
"""
import ast
import operator
import os
import re

import pytest

from conftest import ROOT
from helpers.script_runs import Run, run_script

pytestmark = pytest.mark.slow  # the tests here start processes

EXAMPLES = os.path.join(ROOT, "examples", "python_docs")
LONG_SLEEPS = os.path.join(ROOT, "tests", "helpers", "long_sleeps")


def run_example(name: str, env: dict, returncode: int = 0, quiet: bool = True) -> Run:
    """Run examples/python_docs/<name>.py: check its exit status, that it wrote nothing on
    stderr (``quiet``) and that it left no process behind; return what it wrote."""
    return run_script(os.path.join(EXAMPLES, name + ".py"), env, returncode=returncode, quiet=quiet)


SQUARES = [x * x for x in range(10)]


def logging_long_sleeps(env: dict, log) -> dict:
    """``env`` with every ``time.sleep`` of 5 s or more that the program's processes begin and end
    written to ``log`` (tests/helpers/long_sleeps)."""
    return {**env, "PYTHONPATH": LONG_SLEEPS + os.pathsep + env["PYTHONPATH"], "LONG_SLEEPS_LOG": str(log)}


def long_sleeps(log) -> list[tuple[str, str]]:
    """What ``log`` says of them: ("began" or "ended", seconds), in order."""
    return [(what, seconds) for what, _pid, seconds in (line.split() for line in log.read_text().splitlines())]


# --- Introduction -------------------------------------------------------------------------------

def test_pool_intro(script_env):
    """Introduction: ``with Pool(5) as p: print(p.map(f, [1, 2, 3]))`` "will print [1, 4, 9]"."""
    assert run_example("pool_intro", script_env).out == "[1, 4, 9]\n"


def test_process_hello(script_env):
    """The Process class: Process(target=f, args=('bob',)), start, join prints ``hello bob``."""
    assert run_example("process_hello", script_env).out == "hello bob\n"


def test_process_info(script_env):
    """The Process class, expanded: info() in the main process and in the child.  The main module
    is ``__main__`` in the main process and ``__mp_main__`` (spawn or forkserver) or ``__main__``
    (fork) in the child; the pids are those of two different processes.  (The child's parent is the
    main process with fork and spawn, the fork server with forkserver: fiberrl's jobs start as
    forkserver's, so os.getppid() is not checked against the main process's pid.)"""
    out = run_example("process_info", script_env).out
    match = re.fullmatch(r"main line\nmodule name: __main__\nparent process: (\d+)\nprocess id: (\d+)\n"
                         r"function f\nmodule name: (__mp_main__|__main__)\nparent process: (\d+)\n"
                         r"process id: (\d+)\nhello bob\n", out)
    assert match, out
    main_parent, main_pid, _, child_parent, child_pid = match.groups()
    assert int(main_parent) == os.getpid()  # the test ran the script itself
    assert child_pid != main_pid and child_parent != child_pid, out


def test_start_method(script_env):
    """Contexts and start methods: set_start_method('spawn'), a child puts 'hello' on a Queue."""
    assert run_example("start_method", script_env).out == "hello\n"


def test_get_context(script_env):
    """Contexts and start methods: get_context('spawn'), its Queue and Process."""
    assert run_example("get_context", script_env).out == "hello\n"


def test_queue_exchange(script_env):
    """Exchanging objects, Queues: prints "[42, None, 'hello']"."""
    assert run_example("queue_exchange", script_env).out == "[42, None, 'hello']\n"


def test_pipe_exchange(script_env):
    """Exchanging objects, Pipes: prints "[42, None, 'hello']"."""
    assert run_example("pipe_exchange", script_env).out == "[42, None, 'hello']\n"


def test_lock_print(script_env):
    """Synchronization between processes: ten unjoined processes print 'hello world i' under a
    Lock; the main process waits for them at exit, so all ten lines come out, in any order."""
    out = run_example("lock_print", script_env).out
    assert sorted(out.splitlines()) == sorted(f"hello world {i}" for i in range(10)), out


def test_value_array(script_env):
    """Sharing state, Shared memory: a child sets a Value('d') and negates an Array('i');
    the docs say it prints 3.1415927 and [0, -1, ..., -9]."""
    out = run_example("value_array", script_env).out
    assert out == "3.1415927\n[0, -1, -2, -3, -4, -5, -6, -7, -8, -9]\n"


def test_manager_dict_list(script_env):
    """Sharing state, Server process: a child fills a managed dict and reverses a managed list.
    The dict prints in insertion order, as with multiprocessing (the docs show an older order)."""
    out = run_example("manager_dict_list", script_env).out
    assert out == "{1: '1', '2': 2, 0.25: None}\n[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]\n"


def test_pool_workers(script_env, tmp_path):
    """Using a pool of workers: map, imap_unordered, apply_async(...).get(timeout=1), worker pids,
    and a get(timeout=1) on time.sleep(10) that raises TimeoutError; leaving the with block
    terminates the pool rather than waiting for the sleeping worker."""
    log = tmp_path / "long_sleeps"
    run = run_example("pool_workers", logging_long_sleeps(script_env, log))
    lines = run.out.splitlines()
    assert len(lines) == 17, run.out
    assert lines[0] == str(SQUARES)
    assert sorted(int(x) for x in lines[1:11]) == SQUARES
    assert lines[11] == "400"
    assert re.fullmatch(r"\d+", lines[12]), lines[12]
    pids = ast.literal_eval(lines[13])
    assert len(pids) == 4 and all(isinstance(pid, int) and pid > 0 for pid in pids), lines[13]
    assert os.getpid() not in pids and len(set(pids) | {int(lines[12])}) <= 4, run.out
    assert lines[14:] == ["We lacked patience and got a multiprocessing.TimeoutError",
                          "For the moment, the pool remains available for more work",
                          "Now the pool is closed and no longer available"]
    # the sleep began and never ended: its worker was terminated, not waited for
    assert long_sleeps(log) == [("began", "10")], "the pool waited for time.sleep(10)"


# --- Reference --------------------------------------------------------------------------------

def test_freeze_support_hello(script_env):
    """Miscellaneous, freeze_support(): then Process(target=f).start(), never joined, prints
    'hello world!' before the program ends."""
    assert run_example("freeze_support_hello", script_env).out == "hello world!\n"


def test_sharedctypes_point(script_env):
    """The multiprocessing.sharedctypes module: a child squares a Value('i'), a lock-free
    Value(c_double), upper-cases an Array('c') and squares an Array of a Structure; the docs'
    results (s.value is bytes, so it prints as b'HELLO WORLD')."""
    out = run_example("sharedctypes_point", script_env).out
    assert out == ("49\n0.1111111111111111\nb'HELLO WORLD'\n"
                   "[(3.515625, 39.0625), (33.0625, 4.0), (5.640625, 90.25)]\n")


def test_custom_manager(script_env):
    """Customized managers: a BaseManager subclass serving MathsClass prints 7 and 56."""
    assert run_example("custom_manager", script_env).out == "7\n56\n"


def test_pool_timeout(script_env, tmp_path):
    """Process Pools' example: 100, the squares, 0, 1, 4 from next() and next(timeout=1); then, as
    the docs say, result.get(timeout=1) on time.sleep(10) raises TimeoutError, which ends the
    program (status 1, its traceback on stderr) without waiting for the sleeping worker."""
    log = tmp_path / "long_sleeps"
    run = run_example("pool_timeout", logging_long_sleeps(script_env, log), returncode=1, quiet=False)
    assert run.out == f"100\n{SQUARES}\n0\n1\n4\n"
    last = run.err.rstrip("\n").splitlines()
    assert last[0] == "Traceback (most recent call last):", run.err
    assert "print(result.get(timeout=1))" in run.err
    assert re.fullmatch(r"([\w.]+\.)?TimeoutError(: .*)?", last[-1]), run.err
    assert long_sleeps(log) == [("began", "10")], "the pool waited for time.sleep(10)"


def test_listener_client(script_env):
    """Listeners and Clients: a Listener with an authkey on ('localhost', 6000) accepts a Client (run
    by a Process), sends an object list, bytes and an array('i'); the client prints what the docs'
    comments say it gets."""
    lines = run_example("listener_client", script_env).out.splitlines()
    accepted = [line for line in lines if line.startswith("connection accepted from")]
    assert len(accepted) == 1 and re.fullmatch(r"connection accepted from \('127\.0\.0\.1', \d+\)", accepted[0]), \
        lines
    assert [line for line in lines if line not in accepted] == [
        "[2.25, None, 'junk', <class 'float'>]", "b'hello'", "8", "array('i', [42, 1729, 0, 0, 0])"]


def test_connection_wait(script_env):
    """connection.wait(): four processes each send (i, name) for i in 0..9 on a Pipe; the main
    process prints all 40 messages, each process's in order."""
    messages = [ast.literal_eval(line) for line in run_example("connection_wait", script_env).out.splitlines()]
    assert len(messages) == 40
    names = {f"Process-{i}" for i in range(1, 5)}
    assert {name for _, name in messages} == names
    for name in names:
        assert [i for i, who in messages if who == name] == list(range(10)), messages


def test_log_to_stderr(script_env):
    """Logging: log_to_stderr(), level INFO, logger.warning('doomed') writes
    '[WARNING/MainProcess] doomed' on stderr, first; then a Manager is started and deleted."""
    run = run_example("log_to_stderr", script_env, quiet=False)
    assert run.out == ""
    assert run.err.splitlines()[0] == "[WARNING/MainProcess] doomed", run.err


def test_log_to_stderr_manager_info(script_env):
    """Logging: the docs' session then shows, at INFO, the manager's process starting and
    serving, and the main process sending it the shutdown message (the lines Python 3.11 still
    writes with those words)."""
    lines = run_example("log_to_stderr", script_env, quiet=False).err.splitlines()
    for pattern in (r"\[INFO/SyncManager-\d+\] child process calling self\.run\(\)",
                    r"\[INFO/SyncManager-\d+\] manager serving at .+",
                    r"\[INFO/MainProcess\] sending shutdown message to manager"):
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, lines)


# --- Programming guidelines ----------------------------------------------------------------------

def test_safe_main_import(script_env):
    """Safe importing of main module: freeze_support(), set_start_method('spawn'), an unjoined
    Process printing 'hello'."""
    assert run_example("safe_main_import", script_env).out == "hello\n"


# --- Examples (Doc/includes/mp_*.py) -------------------------------------------------------------

def operator_public_functions() -> tuple:
    """What a proxy for the operator module exposes in multiprocessing: its public callables."""
    return tuple(name for name in dir(operator) if name[0] != "_" and callable(getattr(operator, name)))


def test_mp_newtype(script_env):
    """mp_newtype.py: a manager serving Foo (its public methods, then an exposed= list with _h),
    a generator through a GeneratorProxy, and the operator module; the manager's process prints
    Foo's calls, the main process the rest."""
    lines = run_example("mp_newtype", script_env).out.splitlines()
    calls = [line for line in lines if line.startswith("you called")]
    assert calls == ["you called Foo.f()", "you called Foo.g()", "you called Foo.g()", "you called Foo._h()"]
    dashes = "-" * 20
    assert [line for line in lines if line not in calls] == [
        dashes, dashes, dashes, "".join(f"<{i * i}> " for i in range(10)), dashes,
        "op.add(23, 45) = 68", f"op.pow(2, 94) = {2 ** 94}", f"op._exposed_ = {operator_public_functions()}"]


def normalise_pool_output(out: str) -> tuple[list[str], set[str]]:
    """mp_pool.py's lines with each worker's name written <worker> and the timeout loops' dots
    taken out; and the names."""
    names = set(re.findall(r"^\t ?(\S+) says that ", out, re.M))
    out = re.sub(r"^(\t ?)\S+ says that ", r"\1<worker> says that ", out, flags=re.M)
    return [re.sub(r"(?<=\S)\.+$|(?<=: )\.+$", "", line) for line in out.split("\n")], names


def test_mp_pool(script_env):
    """mp_pool.py: a Pool(4)'s apply_async, imap, imap_unordered and map of 20 tasks that sleep up
    to 0.5 s; ZeroDivisionError from apply, map, list(imap) and IMapIterator.next; then
    ApplyResult.get(0.02) and IMapIterator.next(0.02) retried on TimeoutError until they give the
    results.  Every result is right and in order (but imap_unordered's), all from the 4 workers."""
    lines, names = normalise_pool_output(run_example("mp_pool", script_env).out)
    results = [f"mul({i}, 7) = {i * 7}" for i in range(10)] + [f"plus({i}, 8) = {i + 8}" for i in range(10)]
    ordered = [f"\t <worker> says that {r}" for r in results]
    assert 1 <= len(names) <= 4, names
    unordered_at = lines.index("Unordered results using pool.imap_unordered():")
    assert sorted(lines[unordered_at + 1:unordered_at + 21]) == sorted(ordered), lines
    lines[unordered_at + 1:unordered_at + 21] = ordered
    assert lines == [
        "Creating pool with 4 processes", "",
        "Ordered results using pool.apply_async():", *ordered, "",
        "Ordered results using pool.imap():", *ordered, "",
        "Unordered results using pool.imap_unordered():", *ordered, "",
        "Ordered results using pool.map() --- will block till complete:", *ordered, "",
        "Testing error handling:",
        "\tGot ZeroDivisionError as expected from pool.apply()",
        "\tGot ZeroDivisionError as expected from pool.map()",
        "\tGot ZeroDivisionError as expected from list(pool.imap())",
        "\tGot ZeroDivisionError as expected from IMapIterator.next()", "",
        "Testing ApplyResult.get() with timeout: ", f"\t<worker> says that {results[0]}", "",
        "Testing IMapIterator.next() with timeout: ", *(f"\t<worker> says that {r}" for r in results), "",
        "",
    ]


def test_mp_workers(script_env):
    """mp_workers.py: four Processes take (func, args) tasks from a Queue until 'STOP' and put the
    results on another; the 20 mul results come first, then the 10 plus results added later, each
    group in any order, each from one of the four workers."""
    out = run_example("mp_workers", script_env).out
    lines = out.splitlines()
    assert lines[0] == "Unordered results:" and len(lines) == 31, out
    parsed = [re.fullmatch(r"\t (Process-\d+) says that (.*)", line) for line in lines[1:]]
    assert all(parsed), out
    assert {m.group(1) for m in parsed} <= {f"Process-{i}" for i in range(1, 5)}, out
    said = [m.group(2) for m in parsed]
    assert sorted(said[:20]) == sorted(f"mul({i}, 7) = {i * 7}" for i in range(20))
    assert sorted(said[20:]) == sorted(f"plus({i}, 8) = {i + 8}" for i in range(10))
