"""connection.wait() waiting for messages from several processes at once, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Reference" > "Listeners and Clients" > "Examples" (the
``multiprocessing.connection.wait`` example).
Changed: only the imports (``from multiprocessing import Process, Pipe,
current_process`` -> ``from fiberrl.runtime import Process, Pipe,
current_process``; ``from multiprocessing.connection import wait`` ->
``from fiberrl.runtime.connection import wait``).
Expected output: 40 tuples ``(i, name)``, i from 0 to 9 for each of the four
processes, each process's in order, the processes' interleaved in any way.
"""
import time, random
from fiberrl.runtime import Process, Pipe, current_process
from fiberrl.runtime.connection import wait

def foo(w):
    for i in range(10):
        w.send((i, current_process().name))
    w.close()

if __name__ == '__main__':
    readers = []

    for i in range(4):
        r, w = Pipe(duplex=False)
        readers.append(r)
        p = Process(target=foo, args=(w,))
        p.start()
        # We close the writable end of the pipe now to be sure that
        # p is the only process which owns a handle for it.  This
        # ensures that when p closes its handle for the writable end,
        # wait() will promptly report the readable end as being ready.
        w.close()

    while readers:
        for r in wait(readers):
            try:
                msg = r.recv()
            except EOFError:
                readers.remove(r)
            else:
                print(msg)
