"""A server process Manager sharing a dict and a list, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "Sharing state between processes" > "Server process".
Changed: only the import (``from multiprocessing import Process, Manager`` ->
``from fiberrl.runtime import Process, Manager``).
Expected output: ``{1: '1', '2': 2, 0.25: None}`` then
``[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]``, as the program prints with
``multiprocessing`` (the docs print the dict as ``{0.25: None, 1: '1', '2': 2}``,
the order of the days before dicts kept their insertion order).
"""
from fiberrl.runtime import Process, Manager

def f(d, l):
    d[1] = '1'
    d['2'] = 2
    d[0.25] = None
    l.reverse()

if __name__ == '__main__':
    with Manager() as manager:
        d = manager.dict()
        l = manager.list(range(10))

        p = Process(target=f, args=(d, l))
        p.start()
        p.join()

        print(d)
        print(l)
