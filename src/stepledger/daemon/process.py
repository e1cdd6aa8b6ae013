"""What every daemon shares: JSON logs and graceful signals (its probes: daemon.health)."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from stepledger.terminal import safe

_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


class SafeTextFormatter(logging.Formatter):
    """Plain-text log lines whose message cannot drive the terminal or forge another line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line without its traceback, control characters escaped."""
        return safe(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as a JSON line."""
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update({k: v for k, v in record.__dict__.items() if k not in _STD_ATTRS})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure_logging(*, json_logs: bool, level: str = "INFO") -> None:
    """Send stepledger logs to stderr, as JSON lines or as plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if json_logs else SafeTextFormatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger("stepledger")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like Ctrl-C, so cleanup still runs.

    Without it SIGTERM ends a Python process at once, skipping every ``finally``: a
    command that supervises children would leave them behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Shutdown:
    """A flag set by SIGTERM or SIGINT, so a daemon finishes its batch and exits cleanly."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None

    def install(self) -> Shutdown:
        """Handle SIGTERM and SIGINT in the main thread."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.signal = signum
        self._event.set()

    def request(self) -> None:
        """Ask the daemon to stop (for tests and embedded use)."""
        self._event.set()

    @property
    def requested(self) -> bool:
        """True once a stop was asked for."""
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep until a stop is asked for or the timeout passes; True if asked."""
        return self._event.wait(timeout)
