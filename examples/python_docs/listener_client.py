"""The Listeners and Clients example: a server sends objects and bytes to an authenticated client, run on fiberrl.

Source: Python documentation, Doc/library/multiprocessing.rst,
"Reference" > "Listeners and Clients" > "Examples" (the server code and the
client code).
Changed, besides the imports (``from multiprocessing.connection import
Listener`` / ``Client`` -> ``from fiberrl.runtime.connection import Listener,
Client``): the docs' two programs are one script.  The client's code, as
written, is the body of a function ``client()`` that a ``Process`` runs; the
server's code, as written, runs under ``if __name__ == '__main__':``, and
starts that Process once its listener is bound (before ``accept()``), then
joins it.  ``from fiberrl.runtime import Process`` is the one added import.
Expected output: the server's ``connection accepted from ('127.0.0.1', PORT)``;
the client's ``[2.25, None, 'junk', <class 'float'>]``, ``b'hello'``, ``8`` and
``array('i', [42, 1729, 0, 0, 0])``.
"""
from fiberrl.runtime import Process
from fiberrl.runtime.connection import Listener, Client
from array import array

address = ('localhost', 6000)     # family is deduced to be 'AF_INET'


def client():
    with Client(address, authkey=b'secret password') as conn:
        print(conn.recv())                  # => [2.25, None, 'junk', float]

        print(conn.recv_bytes())            # => 'hello'

        arr = array('i', [0, 0, 0, 0, 0])
        print(conn.recv_bytes_into(arr))    # => 8
        print(arr)                          # => array('i', [42, 1729, 0, 0, 0])


if __name__ == '__main__':
    with Listener(address, authkey=b'secret password') as listener:
        p = Process(target=client)
        p.start()
        with listener.accept() as conn:
            print('connection accepted from', listener.last_accepted)

            conn.send([2.25, None, 'junk', float])

            conn.send_bytes(b'hello')

            conn.send_bytes(array('i', [42, 1729]))
        p.join()
