"""A workflow's timeline as an SVG picture: steps, attempts, decisions and who took them.

Pure: :func:`timeline_svg` turns steps as the fold tells them (a projection's ``steps`` rows,
the inbox's step views, or :class:`~stepledger.domain.state.StepState`) into SVG text, with
no I/O.  Each step is a row: a bar from when it was first seen to when it was decided (or to
now while it is open), coloured by status, labelled with its attempt and who decided it;
a step waiting for a person (an approval, an open escalation, an intent in doubt) is drawn
hatched up to now.  People's answers are marked on the time axis.

Every label is text an agent wrote: control characters are shown as escapes
(:func:`stepledger.terminal.safe`, XML allows none of them) and markup is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from stepledger.terminal import safe

WIDTH = 960
_LABEL = 300
_ROW = 30
_TOP = 40
_RIGHT = 20
_MARK_LINES = 4
_COLOURS = {
    "succeeded": "#2e7d32",
    "approved": "#2e7d32",
    "failed": "#c62828",
    "denied": "#c62828",
    "abandoned": "#6d4c41",
    "not_happened": "#757575",
    "compensating": "#1565c0",
    "compensated": "#1565c0",
    "compensation_failed": "#ad1457",
    "intended": "#f9a825",
    "awaiting_approval": "#6a1b9a",
}
#: Statuses in which the step waits for someone (a person, or recovery for one in doubt).
WAITING = frozenset({"awaiting_approval", "intended", "compensating"})
_WHO = {
    "agent": "the agent",
    "recovery": "recovery",
    "recovery_query": "recovery (query)",
    "recovery_redrive": "recovery (re-drive)",
    "recovery_compensate": "recovery (compensation)",
    "human": "a person",
}


@dataclass(frozen=True)
class Bar:
    """One step's row."""

    step_id: str
    tool: str
    status: str
    attempt: int
    recovery_attempts: int
    decided_by: str
    start: datetime | None
    end: datetime | None
    escalated: bool

    @property
    def waiting(self) -> bool:
        """Whether the step waits: for a person's answer, an approval or a decision."""
        return self.escalated or self.status in WAITING


@dataclass(frozen=True)
class Mark:
    """A moment on the time axis: a person's answer, say."""

    at: datetime
    label: str


def bars(steps: Iterable[Any]) -> list[Bar]:
    """Rows from steps given as mappings (projection rows) or objects (views, states)."""
    return [_bar(step) for step in steps]


def _bar(step: Any) -> Bar:
    def get(name: str, default: Any = None) -> Any:
        if isinstance(step, dict):
            return step.get(name, default)
        return getattr(step, name, default)

    status = str(getattr(get("status", ""), "value", get("status", "")))
    decided = get("resolved_by") or ""
    return Bar(
        step_id=str(get("step_id", "")),
        tool=str(get("tool", "") or ""),
        status=status,
        attempt=int(get("attempt", 0) or 0),
        recovery_attempts=int(get("recovery_attempts", 0) or 0),
        decided_by=str(getattr(decided, "value", decided)),
        start=_utc(get("first_at") or get("intended_at")),
        end=_utc(get("resolved_at")),
        escalated=bool(get("escalation_open", False)),
    )


def timeline_svg(
    title: str, rows: Sequence[Bar], *, now: datetime, marks: Sequence[Mark] = ()
) -> str:
    """The timeline as a standalone SVG document (also valid inline in HTML)."""
    now = _utc(now) or datetime.now(UTC)
    times = [t for r in rows for t in (r.start, r.end) if t is not None]
    times += [m.at for m in marks]
    begin = min(times, default=now)
    end = max([*times, now] if any(r.waiting or r.end is None for r in rows) else times or [now])
    span = max((end - begin).total_seconds(), 0.001)
    height = _TOP + _ROW * max(1, len(rows)) + 24 + 13 * min(len(marks), _MARK_LINES)

    def x(at: datetime | None) -> float:
        if at is None:
            return float(_LABEL)
        return _LABEL + (WIDTH - _LABEL - _RIGHT) * (at - begin).total_seconds() / span

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f"aria-label={quoteattr(safe('timeline of ' + title))}>",
        _DEFS,
        f"<title>{_text('timeline of ' + title)}</title>",
        f'<text x="8" y="20" class="tl-title" font-weight="bold">{_text(title)}</text>',
        f'<text x="{WIDTH - _RIGHT}" y="20" text-anchor="end" class="tl-axis">'
        f"{_text(_when(begin))} to {_text(_when(end))} ({_text(_duration(span))})</text>",
    ]
    for index, row in enumerate(rows):
        parts.append(_row(row, _TOP + index * _ROW, x, now))
    if not rows:
        parts.append(f'<text x="8" y="{_TOP + 18}">no steps recorded yet</text>')
    bottom = _TOP + _ROW * max(1, len(rows))
    for index, mark in enumerate(sorted(marks, key=lambda m: m.at)):
        at = x(mark.at)
        # Labels of marks close in time would overlap: each takes the next line below.
        line = bottom + 16 + 13 * (index % _MARK_LINES)
        parts.append(
            f'<g class="tl-mark"><title>{_text(mark.label)}</title>'
            f'<line x1="{at:.1f}" y1="{_TOP - 6}" x2="{at:.1f}" y2="{line - 10}" '
            'stroke="#333" stroke-dasharray="2 2"/>'
            f'<text x="{at:.1f}" y="{line}" text-anchor="middle" font-size="11">'
            f"{_text(_short(mark.label, 40))}</text></g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


_DEFS = (
    '<defs><pattern id="tl-wait" width="8" height="8" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="8" height="8" fill="#ede7f6"/>'
    '<line x1="0" y1="0" x2="0" y2="8" stroke="#6a1b9a" stroke-width="3"/></pattern></defs>'
)


def _row(row: Bar, top: int, x: Any, now: datetime) -> str:
    start = x(row.start)
    finish = x(row.end if row.end is not None and not row.waiting else now)
    width = max(3.0, finish - start)
    colour = _COLOURS.get(row.status, "#9e9e9e")
    fill = "url(#tl-wait)" if row.waiting else colour
    who = _WHO.get(row.decided_by, row.decided_by)
    detail = [row.status.replace("_", " "), f"attempt {row.attempt}"]
    if row.recovery_attempts:
        detail.append(f"recovery tried {row.recovery_attempts}x")
    if row.waiting:
        detail.append(
            "waits for a person"
            if row.escalated or row.status == "awaiting_approval"
            else "waits for a decision"
        )
    elif who:
        detail.append(f"decided by {who}")
    label = f"{row.step_id} ({row.tool})" if row.tool else row.step_id
    tip = f"{label}: " + ", ".join(detail)
    text_x = min(start + width + 6, WIDTH - _RIGHT)
    anchor = "start" if text_x < WIDTH - 200 else "end"
    return (
        f'<g class="tl-step" data-status={quoteattr(row.status)}>'
        f"<title>{_text(tip)}</title>"
        f'<text x="8" y="{top + 18}" font-family="monospace" font-size="12">'
        f"{_text(_short(label, 38))}</text>"
        f'<rect x="{start:.1f}" y="{top + 5}" width="{width:.1f}" height="{_ROW - 10}" '
        f'rx="3" fill="{fill}" stroke="{colour}"/>'
        # A white halo keeps the text legible where it crosses a bar.
        f'<text x="{text_x:.1f}" y="{top + 18}" font-size="11" text-anchor="{anchor}" '
        'paint-order="stroke" stroke="#fff" stroke-width="3">'
        f"{_text(', '.join(detail))}</text></g>"
    )


def _text(value: str) -> str:
    return escape(safe(value))


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _when(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return str(timedelta(seconds=round(seconds)))
