"""The queue's filters and the ids an answer names, read from a request (4xx on bad input)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode

from stepledger.humanqueue import queue as q


def an_id(value: str) -> bool:
    """True for a workflow or step id a form may name (1-200 printable characters)."""
    return 0 < len(value) <= 200 and value.isprintable()


def read_filter(
    params: Mapping[str, str], fleets: frozenset[str] | None = None
) -> tuple[q.QueueFilter, str | None]:
    """The filter a query string asks for within ``fleets`` (the person's; None: every
    fleet), and why part of it was not understood (or None)."""
    problem = None
    try:
        older = q.parse_age(params.get("age", ""))
    except ValueError as exc:
        older, problem = None, str(exc)
    try:
        page = int(params.get("page", "1")[:12] or 1)
        kind = q.KindFilter(params.get("kind", ""))
        order = q.Order(params.get("order", "newest") or "newest")
        if not 1 <= page <= q.MAX_PAGE:
            raise ValueError(page)
    except ValueError:
        page, kind, order = 1, q.KindFilter.ALL, q.Order.NEWEST
        problem = problem or "unknown page, kind or order: showing the default"
    wanted = q.QueueFilter(
        fleet=params.get("fleet", ""),
        fleets=fleets,
        tool=params.get("tool", ""),
        workflow=params.get("workflow", "").strip(),
        older_than=older,
        kind=kind,
        order=order,
        page=page,
    )
    return wanted, problem


def query_without_page(wanted: q.QueueFilter) -> str:
    """The filter as a query string, without its page (for the pager's links)."""
    age = "" if wanted.older_than is None else f"{int(wanted.older_than.total_seconds())}s"
    params = {
        "fleet": wanted.fleet,
        "tool": wanted.tool,
        "workflow": wanted.workflow,
        "age": age,
        "kind": wanted.kind.value,
        "order": wanted.order.value,
    }
    return urlencode({k: v for k, v in params.items() if v})
