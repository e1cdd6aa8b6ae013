"""The client id a stepledger daemon shows the broker: its role and its version.

``stepledger-projector/0.1.0``, ``stepledger-recovery/0.1.0``: ``stepledger doctor`` tells a
group member of another version by it (a rolling upgrade left half way, say).
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

PREFIX = "stepledger-"


@functools.cache
def stepledger_version() -> str:
    """The installed package's version (``0+unknown`` when run from a bare source tree)."""
    try:
        return version("stepledger")
    except PackageNotFoundError:
        return "0+unknown"


def client_id(role: str) -> str:
    """``stepledger-ROLE/VERSION``."""
    return f"{PREFIX}{role}/{stepledger_version()}"
