"""A customized manager serving a registered MathsClass, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Reference" > "Managers" > "Customized managers".
Changed: only the import (``from multiprocessing.managers import BaseManager``
-> ``from fiberrl.runtime.managers import BaseManager``).
Expected output (as the docs say): ``7`` then ``56``.
"""
from fiberrl.runtime.managers import BaseManager

class MathsClass:
    def add(self, x, y):
        return x + y
    def mul(self, x, y):
        return x * y

class MyManager(BaseManager):
    pass

MyManager.register('Maths', MathsClass)

if __name__ == '__main__':
    with MyManager() as manager:
        maths = manager.Maths()
        print(maths.add(4, 3))         # prints 7
        print(maths.mul(7, 8))         # prints 56
