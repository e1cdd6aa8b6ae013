"""The client id a stepledger daemon shows the broker: its role and its version.

``stepledger-projector/0.1.0``, ``stepledger-recovery/0.1.0``: ``stepledger doctor`` tells a
group member of another version by it (a rolling upgrade left half way, say).
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

from stepledger import wire

PREFIX = "stepledger-"
#: The client id prefix of each daemon role.
ROLES = {
    "projector": wire.PROJECTOR_CLIENT_ID,
    "recovery": wire.RECOVERY_CLIENT_ID,
    "checkpointer": wire.CHECKPOINTER_CLIENT_ID,
}


@functools.cache
def stepledger_version() -> str:
    """The installed package's version (``0+unknown`` when run from a bare source tree)."""
    try:
        return version("stepledger")
    except PackageNotFoundError:
        return "0+unknown"


def client_id(role: str) -> str:
    """``stepledger-ROLE/VERSION``."""
    prefix = ROLES.get(role, PREFIX + role)
    return f"{prefix}{wire.CLIENT_VERSION_SEPARATOR}{stepledger_version()}"
