"""The primitives processes share, built on the processes and messaging
layers: ``channel`` (a FIFO hosted by its creator, what queues and pipes are
made of) and ``dealing_channel`` (one that deals its items to its readers in
turn); ``queues`` (``Queue``, ``SimpleQueue``); ``connection`` (``Pipe``,
``wait``); ``synchronize`` (``Lock``, ``Event``..., held by this process's
manager of shared objects) and ``sharedctypes`` (``Value``, ``Array``, held by
the same); ``ring`` (``Ring`` for torch.distributed).

``fiberrl.runtime.connection``, ``.queues``, ``.synchronize`` and
``.sharedctypes`` re-export these under ``multiprocessing``'s module names;
the pool (``runtime.pool``) and managers (``runtime.managers``) are
primitives too, in folders of their own.
"""
