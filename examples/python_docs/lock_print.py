"""A Lock ensuring that only one process prints at a time, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "Synchronization between processes".
Changed: only the import (``from multiprocessing import Process, Lock`` ->
``from fiberrl.runtime import Process, Lock``).
Expected output: ``hello world 0`` ... ``hello world 9``, one line each, in
any order (the ten processes are never joined explicitly: the main process
waits for them at exit).
"""
from fiberrl.runtime import Process, Lock

def f(l, i):
    l.acquire()
    try:
        print('hello world', i)
    finally:
        l.release()

if __name__ == '__main__':
    lock = Lock()

    for num in range(10):
        Process(target=f, args=(lock, num)).start()
