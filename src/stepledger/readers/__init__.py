"""The read side for the faces and analysts, over the history wing (:mod:`stepledger.history`).

- :mod:`~stepledger.readers.workflows`: the reader names from before the history wing
  (deprecated) and the projector snapshot plus the log's tail (``SnapshotTailReader``);
- :mod:`~stepledger.readers.snapshots`: the projector's published snapshots (one file or a
  shard directory, read as one database);
- :mod:`~stepledger.readers.query`: read-only SQL over them (``stepledger query``, ``status``).

Nothing here writes the log or a projection; the import contract ``readers-below`` keeps
the SDK, the daemons and the faces above this package, and this package below them.
"""
