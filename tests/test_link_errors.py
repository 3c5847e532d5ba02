"""One family of errors for a connection that can no longer be used, at every
layer: ``LinkClosed`` when this process closed it, ``PeerGone`` when the other
side did or died (a manager's ``ManagerError``, a queue's creator gone, a
parent gone), both ``LinkError``s and ``ConnectionError``s; the end of a
pipe's data stays multiprocessing's ``EOFError``."""
import os
import signal
import socket

import pytest

import fiberrl.runtime as mp
from fiberrl.runtime.net.stream import Stream


def test_a_stream_tells_closed_here_from_gone_there():
    mine, theirs = socket.socketpair()
    here, there = Stream(mine, peer="here"), Stream(theirs, peer="there")
    there.close()
    with pytest.raises(mp.PeerGone, match="closed the connection"):
        here.recv()
    here.close()
    with pytest.raises(mp.LinkClosed, match="this process closed"):
        here.send([b"after close"])


def test_the_family_is_one_of_connection_errors():
    assert issubclass(mp.LinkClosed, mp.LinkError) and issubclass(mp.PeerGone, mp.LinkError)
    assert issubclass(mp.LinkError, ConnectionError)
    assert issubclass(mp.ManagerError, mp.PeerGone)


@pytest.mark.slow
def test_a_killed_managers_objects_raise_peer_gone():
    manager = mp.Manager()
    shared = manager.dict()
    shared["x"] = 1
    os.kill(manager._process.pid, signal.SIGKILL)
    manager._process.join(10)
    with pytest.raises(mp.PeerGone):
        shared["x"] = 2


def test_a_pipe_whose_writers_are_gone_ends_with_eof_not_a_link_error():
    reader, writer = mp.Pipe(duplex=False)
    writer.close()
    with pytest.raises(EOFError) as ended:
        reader.recv()
    assert not isinstance(ended.value, mp.LinkError)
