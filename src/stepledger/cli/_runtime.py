"""CLI commands of the runtime (filled in by the runtime work)."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
