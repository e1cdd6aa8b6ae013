"""A pipelined Resolver (the daemon's): one resolution's events sent back to back, in order,
every one acknowledged before a hook runs, a claim is read back or the resolution returns;
a refused event fails the resolution as a refused append did; the fence is checked per send.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.state import StepStatus, WorkflowState
from stepledger.domain.tools import Found, NotFound, Tool
from stepledger.errors import DurabilityError, OwnershipLostError
from stepledger.kafka import Position
from stepledger.kafka.fence import Fence
from stepledger.log import Acknowledgement, InMemoryEventLog
from stepledger.recovery.fence import FencedLog
from stepledger.resolution import Resolver, ToolRegistry
from tests.unit.factories import Clock

ARGS = {"amount": 5}


class SlowAcks(InMemoryEventLog):
    """An in-memory log whose sends are acknowledged only when their wait is called."""

    def __init__(self, refuse: str | None = None) -> None:
        super().__init__()
        self.sent: list[str] = []
        self.acked: list[str] = []
        self.refuse = refuse

    def send(self, event: ev.Event) -> Acknowledgement:
        self.sent.append(event.type)

        def acknowledged() -> Position:
            if event.type == self.refuse:
                raise DurabilityError("record not acknowledged: refused")
            self.acked.append(event.type)
            return self.append(event)

        return acknowledged


def _setup(log: SlowAcks, tool: Tool) -> tuple[Resolver, WorkflowState, Clock]:
    clock = Clock()
    resolver = Resolver(
        log, EventFactory("f", "recovery", clock), ToolRegistry([tool]), clock=clock, pipeline=True
    )
    state = WorkflowState("wf")
    state.apply(EventFactory("f", "agent", clock).intent("wf", "s", tool, ARGS, sequence=0))
    clock.now += timedelta(seconds=tool.timeout_s + 1)
    return resolver, state, clock


def _tool(query: Any, **kw: Any) -> Tool:
    return Tool(name="pay", keyed=True, policy="query", query=query, timeout_s=1, **kw)


def test_a_resolution_sends_its_events_in_order_and_returns_them_acknowledged() -> None:
    log = SlowAcks()
    resolver, state, _ = _setup(log, _tool(lambda a, k: Found({"ok": k})))
    resolution = resolver.attempt(state, "s")
    assert log.sent == log.acked == ["resolution_attempted", "step_outcome"]
    assert [e.type for e in log.events] == log.sent
    assert [p.offset for p in resolution.positions] == [0, 1]
    assert resolution.step.status is StepStatus.SUCCEEDED


def test_what_was_sent_before_a_hook_is_acknowledged_before_the_hook_runs() -> None:
    log = SlowAcks()
    seen_at_redrive: list[list[str]] = []

    def redrive(args: dict[str, Any], key: str) -> dict[str, Any]:
        seen_at_redrive.append(list(log.acked))
        return {"again": key}

    tool = _tool(lambda a, k: NotFound("none"), redrive=redrive)
    resolver, state, _ = _setup(log, tool)
    resolution = resolver.attempt(state, "s")
    # The query's attempt record is durable before the re-drive's effect.
    assert seen_at_redrive == [["resolution_attempted"]]
    assert log.acked == ["resolution_attempted", "resolution_attempted", "step_outcome"]
    assert resolution.step.status is StepStatus.SUCCEEDED


def test_a_refused_event_fails_the_resolution_as_a_refused_append_did() -> None:
    log = SlowAcks(refuse="step_outcome")
    resolver, state, _ = _setup(log, _tool(lambda a, k: Found({"ok": k})))
    with pytest.raises(DurabilityError, match="refused"):
        resolver.attempt(state, "s")
    # Nothing claims the outcome is in the log: only the acknowledged attempt is there.
    assert [e.type for e in log.events] == ["resolution_attempted"]


def test_no_event_leaves_for_a_partition_no_longer_owned() -> None:
    log = SlowAcks()
    fence = Fence(session_s=10, heartbeat_s=1)
    fence.assigned({0})
    fenced = FencedLog(log, fence)
    resolver, state, _ = _setup(log, _tool(lambda a, k: Found({"ok": k})))
    resolver.log = fenced
    fence.working_on(0)
    fence.revoked({0})
    with pytest.raises(OwnershipLostError):
        resolver.attempt(state, "s")
    assert log.sent == [] and log.events == []
