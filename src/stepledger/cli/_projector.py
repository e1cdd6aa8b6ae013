"""CLI commands of the projector (filled in by the projector work)."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
