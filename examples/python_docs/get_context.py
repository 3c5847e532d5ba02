"""Using a context object from get_context, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "Contexts and start methods" (``ctx = mp.get_context('spawn')``).
Changed: only the import (``import multiprocessing as mp`` ->
``import fiberrl.runtime as mp``).
Expected output: ``hello``.
"""
import fiberrl.runtime as mp

def foo(q):
    q.put('hello')

if __name__ == '__main__':
    ctx = mp.get_context('spawn')
    q = ctx.Queue()
    p = ctx.Process(target=foo, args=(q,))
    p.start()
    print(q.get())
    p.join()
