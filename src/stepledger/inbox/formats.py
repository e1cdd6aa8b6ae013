"""How the inbox's templates show values: JSON, ages, times and labels (Jinja2 filters)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


def pretty(value: Any) -> str:
    """A value as indented JSON."""
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago: ``42s``, ``5m``, ``3h``, ``2d`` (``-`` for none)."""
    if value is None:
        return "-"
    seconds = max(0.0, ((now or datetime.now(UTC)) - value).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def when(value: datetime | None) -> str:
    """A time in UTC, to the second (``-`` for none)."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def label(value: str) -> str:
    """An enum value as words."""
    return value.replace("_", " ")


FILTERS: dict[str, Callable[..., str]] = {
    "pretty": pretty,
    "ago": ago,
    "when": when,
    "label": label,
}
"""The filters by the names the templates use."""
