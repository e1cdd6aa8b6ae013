"""``stepledger simulate``: a deterministic simulation of the whole protocol (placeholder)."""
