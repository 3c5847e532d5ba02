"""Exchanging objects between processes through a Queue, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "Exchanging objects between processes" > "Queues".
Changed: only the import (``from multiprocessing import Process, Queue`` ->
``from fiberrl.runtime import Process, Queue``).
Expected output (as the docs say): ``[42, None, 'hello']``.
"""
from fiberrl.runtime import Process, Queue

def f(q):
    q.put([42, None, 'hello'])

if __name__ == '__main__':
    q = Queue()
    p = Process(target=f, args=(q,))
    p.start()
    print(q.get())    # prints "[42, None, 'hello']"
    p.join()
