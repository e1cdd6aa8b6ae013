"""CLI commands for the log itself: broker, append, tail."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add this area's commands to the group."""
