"""Selecting a start method with set_start_method, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "Contexts and start methods" (``mp.set_start_method('spawn')``).
Changed: only the import (``import multiprocessing as mp`` ->
``import fiberrl.runtime as mp``).
Expected output: ``hello``.
"""
import fiberrl.runtime as mp

def foo(q):
    q.put('hello')

if __name__ == '__main__':
    mp.set_start_method('spawn')
    q = mp.Queue()
    p = mp.Process(target=foo, args=(q,))
    p.start()
    print(q.get())
    p.join()
