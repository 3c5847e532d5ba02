"""The Introduction's basic example of data parallelism with Pool, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" (``with Pool(5) as p: print(p.map(f, [1, 2, 3]))``).
Changed: only the import (``from multiprocessing import Pool`` ->
``from fiberrl.runtime import Pool``).
Expected output (as the docs say): ``[1, 4, 9]``.
"""
from fiberrl.runtime import Pool

def f(x):
    return x*x

if __name__ == '__main__':
    with Pool(5) as p:
        print(p.map(f, [1, 2, 3]))
