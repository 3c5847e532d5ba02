"""Safe importing of the main module: the protected entry point, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Programming guidelines" > "The spawn and forkserver start methods" >
"Safe importing of main module" (the version with ``if __name__ ==
'__main__':``, ``freeze_support()`` and ``set_start_method('spawn')``).
Changed: only the import (``from multiprocessing import Process,
freeze_support, set_start_method`` -> ``from fiberrl.runtime import Process,
freeze_support, set_start_method``).
Expected output: ``hello`` (the process is never joined explicitly: the main
process waits for it at exit).
"""
from fiberrl.runtime import Process, freeze_support, set_start_method

def foo():
    print('hello')

if __name__ == '__main__':
    freeze_support()
    set_start_method('spawn')
    p = Process(target=foo)
    p.start()
