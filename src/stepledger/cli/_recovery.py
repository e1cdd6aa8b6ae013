"""CLI commands of the recovery (filled in by the recovery work)."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
