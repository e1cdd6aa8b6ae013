"""Workflow checkpoints on a compacted topic: the record, the reader view, the checkpointer."""
