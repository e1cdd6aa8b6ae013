"""The demo's own failure: a StepLedgerError, so the CLI prints it as one line."""

from __future__ import annotations

from stepledger.errors import StepLedgerError


class DemoError(StepLedgerError):
    """``stepledger demo`` did not go as its script says (a wait timed out, an effect repeated)."""
