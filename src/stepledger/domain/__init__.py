"""Pure domain core: events, tool specs, ids and the step state machine (no I/O)."""
