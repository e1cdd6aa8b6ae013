"""One way to read a workflow: :class:`WorkflowHistory`, bound to one step log.

- :mod:`~stepledger.history.protocol`: the protocol and its answer, :class:`History`;
- :mod:`~stepledger.history.kafka`: the Kafka implementation (the workflow's partition,
  its tail index, and the checkpoint directory where retention deleted the head);
- :mod:`~stepledger.history.memory`: the in-memory implementation (over an
  :class:`~stepledger.log.InMemoryEventLog`);
- :mod:`~stepledger.history.adapt`: a history over a reader of the older ``read`` surface.
"""
