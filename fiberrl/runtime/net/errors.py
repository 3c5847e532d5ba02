"""The one family of errors for a connection between processes of a run
that can no longer be used, whichever layer meets it (a stream, a queue or
pipe's owner, a child's parent, a manager): either this process closed it
(``LinkClosed``) or the other side did, died, or could not be reached
(``PeerGone``), as trio tells its ClosedResourceError from its
BrokenResourceError.  Both are ``ConnectionError``s.

Not of this family: the end of a pipe's data (``EOFError``, as in
multiprocessing: the writers closed it, a normal end) and an exception
raised by the other side's code (``RemoteError``, re-raised here)."""


class LinkError(ConnectionError):
    """A connection of the run can no longer be used (one of the two below)."""


class LinkClosed(LinkError):
    """This process closed the connection; what was asked of it after that cannot be done."""


class PeerGone(LinkError):
    """The other side closed the connection, died, stopped answering or could not be reached."""


class PeerMisbehaved(PeerGone):
    """The other side sent what no peer of this run sends; the connection is ended."""
