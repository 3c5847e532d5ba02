"""The messaging layer: authenticated framed streams between processes
(``stream``; ``shared_frames`` for large frames within a host), the
handshake and MACs (``auth``), the listener that accepts them
(``listener``), one thread reading many (``stream_pump``), request/reply on
top (``calls``, ``transport``) and how values travel (``wire``)."""
