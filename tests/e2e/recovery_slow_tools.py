"""A bookings tool whose compensation cancels and then stalls, to kill a daemon mid-resolution."""

from __future__ import annotations

import os
import time
from typing import Any

from stepledger.domain.tools import NotFound
from stepledger.resolution.registry import ToolRegistry
from stepledger_dev.examples.tools import bookings_tool, payments_tool

STALL_S = 20.0


def registry() -> ToolRegistry:
    """The example bookings tool, with a compensation that stalls after its effect."""
    plain = bookings_tool(os.environ["STEPLEDGER_BOOKINGS_URL"], timeout_s=STALL_S + 10)
    cancel = plain.compensate
    assert cancel is not None

    def stalling(args: dict[str, Any], key: str, known: Any) -> Any | NotFound:
        answer = cancel(args, key, known)
        time.sleep(STALL_S)  # the daemon is SIGKILLed here: effect done, outcome not recorded
        return answer

    return ToolRegistry([plain.model_copy(update={"compensate": stalling})])


SLOW_REDRIVE_S = 1.0


def slow_redrive_registry() -> ToolRegistry:
    """The example payments tool whose re-drive takes a second: work queues up in a daemon."""
    plain = payments_tool(os.environ["STEPLEDGER_PAYMENTS_URL"], timeout_s=10.0)
    redrive = plain.redrive_hook
    assert redrive is not None

    def slow(args: dict[str, Any], key: str) -> Any:
        time.sleep(SLOW_REDRIVE_S)
        return redrive(args, key)

    return ToolRegistry([plain.model_copy(update={"redrive": slow})])
