"""The Process Pools section's example: apply_async, map, imap, next(timeout)
and a get() that times out, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Reference" > "Process Pools" ("The following example demonstrates the use of
a pool").
Changed: only the import (``from multiprocessing import Pool`` ->
``from fiberrl.runtime import Pool``).
Expected output: ``100``, ``[0, 1, 4, 9, 16, 25, 36, 49, 64, 81]``, ``0``,
``1``, ``4``; then, as the docs say, the last ``result.get(timeout=1)`` raises
``multiprocessing.TimeoutError``: the program ends with its traceback and
exit status 1 (leaving the ``with`` block terminates the pool, sleeping
worker included).
"""
from fiberrl.runtime import Pool
import time

def f(x):
    return x*x

if __name__ == '__main__':
    with Pool(processes=4) as pool:         # start 4 worker processes
        result = pool.apply_async(f, (10,)) # evaluate "f(10)" asynchronously in a single process
        print(result.get(timeout=1))        # prints "100" unless your computer is *very* slow

        print(pool.map(f, range(10)))       # prints "[0, 1, 4,..., 81]"

        it = pool.imap(f, range(10))
        print(next(it))                     # prints "0"
        print(next(it))                     # prints "1"
        print(it.next(timeout=1))           # prints "4" unless your computer is *very* slow

        result = pool.apply_async(time.sleep, (10,))
        print(result.get(timeout=1))        # raises multiprocessing.TimeoutError
