"""The read side, below the SDK, the daemons and the faces that read the ledger.

- :mod:`~stepledger.readers.workflows`: one workflow's events, from the log (a scan, or the
  partition index and checkpoints) or from a projector snapshot plus the log's tail;
- :mod:`~stepledger.readers.index`: the long-lived index of which workflows a partition
  holds and where (what makes an open read only its workflow's records);
- :mod:`~stepledger.readers.history`: a workflow's checkpoint plus the log after it, and
  the proof that a workflow is new once the log head has expired;
- :mod:`~stepledger.readers.snapshots`: the projector's published snapshots (one file or a
  shard directory, read as one database);
- :mod:`~stepledger.readers.query`: read-only SQL over them (``stepledger query``, ``status``).

Nothing here writes the log or a projection; the import contract ``readers-below`` keeps
the SDK, the daemons and the faces above this package, and this package below them.
"""
