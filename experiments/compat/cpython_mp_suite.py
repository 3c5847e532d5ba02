"""CPython's own multiprocessing tests (``test._test_multiprocessing``,
shipped with Python) run against ``fiberrl.runtime``: the suite's
processes and manager mixins take their Process, Queue, Pipe, Pool, Lock...
from fiberrl instead of multiprocessing.  Run under pytest, which collects
the test classes this module installs, with a time limit per test:

    python -m pytest experiments/compat/cpython_mp_suite.py -p no:cacheprovider -q --timeout 60 -rfE

The suite's "threads" flavour (multiprocessing.dummy) and its tests of
multiprocessing's own internals (plain TestCases) are not installed: they
test threads and CPython's modules, not this API.
"""
from __future__ import annotations

import multiprocessing

import test._test_multiprocessing as suite

import fiberrl.runtime as fiberrl
from fiberrl.runtime import sharedctypes
from fiberrl.runtime.primitives.synchronize import shutdown_manager

_SAME_NAMES = ("current_process", "parent_process", "active_children", "Pool", "Pipe", "Queue", "JoinableQueue",
               "Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier", "Value", "Array",
               "RawValue", "RawArray")


def _point_the_suite_at_fiberrl() -> None:
    mixin = suite.ProcessesMixin
    mixin.Process = fiberrl.Process
    mixin.connection = fiberrl.connection
    for name in _SAME_NAMES:
        setattr(mixin, name, staticmethod(getattr(fiberrl, name)))
    # the manager flavour makes its manager with multiprocessing.Manager() in setUpClass
    suite.multiprocessing.Manager = fiberrl.Manager
    # the shared ctypes tests call the module's own import, multiprocessing.sharedctypes.Value
    suite.Value = sharedctypes.Value


_point_the_suite_at_fiberrl()
suite.install_tests_in_module_dict(globals(), "spawn", only_type="processes")
suite.install_tests_in_module_dict(globals(), "spawn", only_type="manager")
# passes OS sockets between processes through multiprocessing's resource sharer (descriptor
# passing on one host), which a job on another host cannot take part in; run here, it
# closes descriptors of this process and every test after it fails
del WithProcessesTestPicklingConnections  # noqa: F821
_ = multiprocessing  # the suite's own module-level checks still use it
_suite_teardown = tearDownModule  # noqa: F821 -- installed above


def tearDownModule():  # noqa: N802,F811 -- unittest's name, which pytest calls
    # the process's manager of module-level Lock, Value...: multiprocessing has no such process,
    # and the suite's teardown waits for every holder of the resource tracker to end
    shutdown_manager()
    _suite_teardown()
