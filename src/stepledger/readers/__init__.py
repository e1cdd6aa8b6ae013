"""The analysts' read side: the projector's published snapshots, and SQL over them.

- :mod:`~stepledger.readers.snapshots`: the projector's published snapshots (one file or a
  shard directory, read as one database);
- :mod:`~stepledger.readers.query`: read-only SQL over them (``stepledger query``, ``status``).

Nothing here writes the log or a projection, and nothing here reads Kafka: the import
contract ``readers-below`` keeps every other part of the library above this package (the
history wing's :class:`~stepledger.history.legacy.SnapshotTailReader` reads a
workflow's snapshot through it).
"""
