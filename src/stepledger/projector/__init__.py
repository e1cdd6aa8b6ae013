"""The projector: materialises the step log into DuckDB, the queryable face of the ledger.

``daemon`` runs the consumer; ``engine`` projects batches exactly once; ``fold`` turns
events into rows with the domain's state machine; ``store`` writes DuckDB; ``snapshot``
publishes read-only copies (read, with SQL over them, by :mod:`stepledger.readers`); ``rebuild``
starts over from offset 0.
"""

from __future__ import annotations

from stepledger.projector.daemon import ProjectorOptions, run_projector
from stepledger.projector.engine import Projector
from stepledger.projector.rebuild import rebuild
from stepledger.projector.snapshot import (
    latest_snapshot,
    snapshot_path,
    workflow_events_from_snapshot,
)
from stepledger.projector.store import ProjectionStore
from stepledger.readers.query import run_query, workflow_status

__all__ = [
    "ProjectionStore",
    "Projector",
    "ProjectorOptions",
    "latest_snapshot",
    "rebuild",
    "run_projector",
    "run_query",
    "snapshot_path",
    "workflow_events_from_snapshot",
    "workflow_status",
]
