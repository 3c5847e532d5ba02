"""Exchanging objects between processes through a Pipe, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Introduction" > "Exchanging objects between processes" > "Pipes".
Changed: only the import (``from multiprocessing import Process, Pipe`` ->
``from fiberrl.runtime import Process, Pipe``).
Expected output (as the docs say): ``[42, None, 'hello']``.
"""
from fiberrl.runtime import Process, Pipe

def f(conn):
    conn.send([42, None, 'hello'])
    conn.close()

if __name__ == '__main__':
    parent_conn, child_conn = Pipe()
    p = Process(target=f, args=(child_conn,))
    p.start()
    print(parent_conn.recv())   # prints "[42, None, 'hello']"
    p.join()
