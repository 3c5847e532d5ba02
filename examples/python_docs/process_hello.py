"""The Process class's trivial example, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "The Process class" (``Process(target=f, args=('bob',))``).
Changed: only the import (``from multiprocessing import Process`` ->
``from fiberrl.runtime import Process``).
Expected output: ``hello bob``.
"""
from fiberrl.runtime import Process

def f(name):
    print('hello', name)

if __name__ == '__main__':
    p = Process(target=f, args=('bob',))
    p.start()
    p.join()
