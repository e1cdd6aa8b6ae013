"""The producer SDK agents call: workflows and durable intent/outcome brackets."""

from stepledger.producer.ledger import Ledger, Workflow

__all__ = ["Ledger", "Workflow"]
