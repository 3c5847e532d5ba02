"""The Process class's expanded example showing the process ids involved, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "The Process class" (``info(title)`` printing
``os.getppid()`` and ``os.getpid()``).
Changed: only the import (``from multiprocessing import Process`` ->
``from fiberrl.runtime import Process``).
Expected output: ``main line``, the module name ``__main__``, the main
process's parent and its own pid; then ``function f``, the child's module name
(``__mp_main__`` with the spawn start method, ``__main__`` with fork), as its
parent the main process's pid, its own pid, and ``hello bob``.
"""
from fiberrl.runtime import Process
import os

def info(title):
    print(title)
    print('module name:', __name__)
    print('parent process:', os.getppid())
    print('process id:', os.getpid())

def f(name):
    info('function f')
    print('hello', name)

if __name__ == '__main__':
    info('main line')
    p = Process(target=f, args=('bob',))
    p.start()
    p.join()
