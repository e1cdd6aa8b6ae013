"""``stepledger chaos``: a crash-window fault-injection harness and its invariant checks."""
