"""Fiber's basic queue example, run on fiberrl.

Source: Fiber's repository, examples/basic_queue.py, github.com/uber/fiber at
ad6faf02b8e94dee498990e9fd9c588234666725.
Changed: only the import (``from fiber import Process, SimpleQueue`` ->
``from fiberrl.runtime import Process, SimpleQueue``).
Expected output: ``63``.
"""
from fiberrl.runtime import Process, SimpleQueue

def foo(q, a, b):
    q.put(a + b)

if __name__ == '__main__':
    q = SimpleQueue()
    p = Process(target=foo, args=(q, 42, 21))
    p.start()
    print(q.get())
    p.join()
