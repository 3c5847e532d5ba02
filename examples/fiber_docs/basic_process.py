"""Fiber's basic Process example, run on fiberrl.

Source: Fiber's repository, examples/basic_process.py (the same ``f('Fiber')``
program as the Process page of its API docs, docs/process), github.com/uber/fiber
at ad6faf02b8e94dee498990e9fd9c588234666725.
Changed: only the import (``from fiber import Process`` ->
``from fiberrl.runtime import Process``).
Expected output: ``Hello Fiber`` then ``Done``.
"""
from fiberrl.runtime import Process

def f(name):
    print('Hello', name)

if __name__ == "__main__":
    p = Process(target=f, args=('Fiber',))
    p.start()
    p.join()
    print('Done')
