"""ctypes objects (a Value, a c_char Array, an Array of a Structure) modified by a child, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Reference" > "Shared ctypes Objects" > "The multiprocessing.sharedctypes module".
Changed: only the imports (``from multiprocessing import Process, Lock`` ->
``from fiberrl.runtime import Process, Lock``;
``from multiprocessing.sharedctypes import Value, Array`` ->
``from fiberrl.runtime.sharedctypes import Value, Array``).
Expected output (as the docs say): ``49``, ``0.1111111111111111``,
``HELLO WORLD`` (printed as ``b'HELLO WORLD'``, ``s.value`` being bytes) and
``[(3.515625, 39.0625), (33.0625, 4.0), (5.640625, 90.25)]``.
"""
from fiberrl.runtime import Process, Lock
from fiberrl.runtime.sharedctypes import Value, Array
from ctypes import Structure, c_double

class Point(Structure):
    _fields_ = [('x', c_double), ('y', c_double)]

def modify(n, x, s, A):
    n.value **= 2
    x.value **= 2
    s.value = s.value.upper()
    for a in A:
        a.x **= 2
        a.y **= 2

if __name__ == '__main__':
    lock = Lock()

    n = Value('i', 7)
    x = Value(c_double, 1.0/3.0, lock=False)
    s = Array('c', b'hello world', lock=lock)
    A = Array(Point, [(1.875,-6.25), (-5.75,2.0), (2.375,9.5)], lock=lock)

    p = Process(target=modify, args=(n, x, s, A))
    p.start()
    p.join()

    print(n.value)
    print(x.value)
    print(s.value)
    print([(a.x, a.y) for a in A])
