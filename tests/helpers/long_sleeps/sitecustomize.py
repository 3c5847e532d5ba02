"""Put on PYTHONPATH with LONG_SLEEPS_LOG set, this records every ``time.sleep`` of 5 s or more that
the processes of a program begin and end (a line "began <pid> <seconds>" before, "ended <pid>
<seconds>" after, in that file), so that a test can tell a sleep that was cut short by its process
being ended from one that was waited for, however slow the machine.  Python imports this module
at start-up; any other sitecustomize on the path is run after it."""
import importlib.machinery
import importlib.util
import os
import sys
import time

_LOG = os.environ.get("LONG_SLEEPS_LOG")
_HERE = os.path.dirname(os.path.abspath(__file__))

if _LOG:
    _sleep = time.sleep

    def _note(what: str, seconds: float) -> None:
        with open(_LOG, "a") as fh:
            fh.write(f"{what} {os.getpid()} {seconds}\n")

    def sleep(seconds):
        if seconds < 5:
            return _sleep(seconds)
        _note("began", seconds)
        _sleep(seconds)
        _note("ended", seconds)

    sleep.__module__, sleep.__qualname__ = "time", "sleep"  # pickled as time.sleep, this one where loaded
    time.sleep = sleep

# the sitecustomize this one hides, if any
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
