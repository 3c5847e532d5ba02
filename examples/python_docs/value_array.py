"""Shared memory with Value and Array, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "Sharing state between processes" > "Shared memory".
Changed: only the import (``from multiprocessing import Process, Value, Array``
-> ``from fiberrl.runtime import Process, Value, Array``).
Expected output (as the docs say): ``3.1415927`` then
``[0, -1, -2, -3, -4, -5, -6, -7, -8, -9]``.
"""
from fiberrl.runtime import Process, Value, Array

def f(n, a):
    n.value = 3.1415927
    for i in range(len(a)):
        a[i] = -a[i]

if __name__ == '__main__':
    num = Value('d', 0.0)
    arr = Array('i', range(10))

    p = Process(target=f, args=(num, arr))
    p.start()
    p.join()

    print(num.value)
    print(arr[:])
