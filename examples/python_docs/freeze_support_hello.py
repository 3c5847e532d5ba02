"""freeze_support() called straight after the main guard, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Reference" > "Process and exceptions" ... "Miscellaneous" > ``freeze_support()``.
Changed: only the import (``from multiprocessing import Process,
freeze_support`` -> ``from fiberrl.runtime import Process, freeze_support``).
Expected output: ``hello world!`` (the process is never joined explicitly:
the main process waits for it at exit).
"""
from fiberrl.runtime import Process, freeze_support

def f():
    print('hello world!')

if __name__ == '__main__':
    freeze_support()
    Process(target=f).start()
