"""What a manager's proxies and its server say to each other: the op of each
call, the method name that asks for a copy of the object, and the kinds of
reply.

A call: op, call id (0: no reply wanted), object token (``net.calls.HEAD``),
then its pickled arguments; a reply: the call it answers (``net.calls.CALL_ID``),
then the pickled (kind, value).
"""

M_CREATE, M_CALL, M_INCREF, M_DECREF, M_SHUTDOWN, M_COUNT, M_DEBUG_INFO = range(1, 8)
GETVALUE = "#getvalue"  # an M_CALL's method name: a copy of the object itself
# reply kinds
RETURN, RAISE, PROXY = 0, 1, 2
