"""Events as JSON lines (the models' JSON form): parse all-or-nothing, render one per line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from stepledger.domain.events import Event


@dataclass(frozen=True)
class LineError:
    """Why one input line is not a valid event."""

    line: int
    reason: str


@dataclass(frozen=True)
class Line:
    """One valid event and the input line it came from."""

    line: int
    event: Event


def parse_event_lines(lines: Iterable[str | bytes]) -> tuple[list[Line], list[LineError]]:
    """Parse every non-blank line as an event; return the events and every line's error."""
    events: list[Line] = []
    errors: list[LineError] = []
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode() if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            errors.append(LineError(number, f"not UTF-8 (byte {exc.start})"))
            continue
        text = text.strip()
        if not text:
            continue
        try:
            events.append(Line(number, Event.model_validate_json(text)))
        except ValidationError as exc:
            errors.append(LineError(number, _reason(exc)))
    return events, errors


def render_event(event: Event) -> str:
    """One event as a JSON line that ``parse_event_lines`` reads back to an equal event."""
    return event.model_dump_json()


def _reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    parts = [" ".join(p.split()) for p in parts]  # one line per error, whatever the input held
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
