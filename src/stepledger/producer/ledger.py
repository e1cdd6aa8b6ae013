"""The SDK: a Ledger hands out workflow handles whose steps bracket tool calls durably.

A step's intent is acknowledged by Kafka before the tool is called, and its outcome
(success or the raised error) is acknowledged after.  Each call waits only for its own
records, so many agents in one process (threads or coroutines) never serialise.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import Clock, EventFactory, utc_now
from stepledger.domain.state import WorkflowState
from stepledger.domain.tools import Tool
from stepledger.errors import ToolDefinitionError
from stepledger.log import EventLog, KafkaEventLog

ToolFn = Callable[[dict[str, Any], str], Any]


class Ledger:
    """Entry point of the SDK: one per process, shared by every agent in it."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        log: EventLog | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.settings = settings or Settings()
        self.log: EventLog = log if log is not None else KafkaEventLog(self.settings)
        self.events = EventFactory(self.settings.fleet_id, self.settings.producer_id, clock)

    def start(
        self, workflow_id: str, *, name: str = "", read_only: bool = False, max_attempts: int = 5
    ) -> Workflow:
        """Start a new workflow: its started event is durable when this returns."""
        workflow = Workflow(self, workflow_id)
        workflow.record(
            self.events.workflow_started(
                workflow_id, name=name, attempt=1, read_only=read_only, max_attempts=max_attempts
            )
        )
        return workflow

    async def astart(
        self, workflow_id: str, *, name: str = "", read_only: bool = False, max_attempts: int = 5
    ) -> Workflow:
        """Start a new workflow (asyncio)."""
        workflow = Workflow(self, workflow_id)
        await workflow.arecord(
            self.events.workflow_started(
                workflow_id, name=name, attempt=1, read_only=read_only, max_attempts=max_attempts
            )
        )
        return workflow

    def close(self) -> None:
        """Flush and close the event log."""
        self.log.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Workflow:
    """One workflow's handle: records its steps and keeps its state as the log tells it."""

    def __init__(self, ledger: Ledger, workflow_id: str) -> None:
        self.ledger = ledger
        self.workflow_id = workflow_id
        self.state = WorkflowState(workflow_id)
        self._lock = threading.Lock()

    def record(self, event: ev.Event) -> None:
        """Append an event durably, then fold it into the local state."""
        self.ledger.log.append(event)
        with self._lock:
            self.state.apply(event)

    async def arecord(self, event: ev.Event) -> None:
        """Append an event durably (asyncio), then fold it into the local state."""
        await self.ledger.log.append_async(event)
        with self._lock:
            self.state.apply(event)

    def step(
        self,
        step_id: str,
        tool: Tool,
        arguments: Mapping[str, Any] | None = None,
        fn: ToolFn | None = None,
    ) -> Any:
        """Run one tool call bracketed by a durable intent and a durable outcome.

        ``fn(arguments, idempotency_key)`` (or ``tool.run``) is called only after the intent
        is acknowledged; if that fails, a DurabilityError is raised and nothing is called.
        A raised error is recorded as a failed outcome and re-raised.
        """
        call = self._intent(step_id, tool, dict(arguments or {}))
        self.record(call.event)
        try:
            result = _runner(tool, fn)(call.arguments, call.key)
        except Exception as exc:
            self.record(self._outcome(call, OutcomeStatus.FAILED, error=exc))
            raise
        self.record(self._outcome(call, OutcomeStatus.SUCCEEDED, result=result))
        return result

    async def astep(
        self,
        step_id: str,
        tool: Tool,
        arguments: Mapping[str, Any] | None = None,
        fn: Callable[[dict[str, Any], str], Any | Awaitable[Any]] | None = None,
    ) -> Any:
        """Run one tool call bracketed durably (asyncio); ``fn`` may be sync or async."""
        call = self._intent(step_id, tool, dict(arguments or {}))
        await self.arecord(call.event)
        run = _runner(tool, fn)
        try:
            if inspect.iscoroutinefunction(run):
                result = await run(call.arguments, call.key)
            else:
                result = await asyncio.to_thread(run, call.arguments, call.key)
        except Exception as exc:
            await self.arecord(self._outcome(call, OutcomeStatus.FAILED, error=exc))
            raise
        await self.arecord(self._outcome(call, OutcomeStatus.SUCCEEDED, result=result))
        return result

    def _intent(self, step_id: str, tool: Tool, arguments: dict[str, Any]) -> _PendingCall:
        with self._lock:
            known = self.state.steps.get(step_id)
            sequence = known.sequence if known else len(self.state.steps)
            attempt = (known.attempt + 1) if known else 1
        event = self.ledger.events.intent(
            self.workflow_id, step_id, tool, arguments, sequence=sequence, attempt=attempt
        )
        assert isinstance(event.body, ev.StepIntended)
        return _PendingCall(event, step_id, event.body.idempotency_key, arguments, attempt)

    def _outcome(
        self,
        call: _PendingCall,
        status: OutcomeStatus,
        *,
        result: Any = None,
        error: BaseException | None = None,
    ) -> ev.Event:
        return self.ledger.events.outcome(
            self.workflow_id,
            call.step_id,
            attempt=call.attempt,
            status=status,
            result=result,
            error=error,
        )


@dataclass(frozen=True)
class _PendingCall:
    event: ev.Event
    step_id: str
    key: str
    arguments: dict[str, Any]
    attempt: int


def _runner(tool: Tool, fn: Callable[..., Any] | None) -> Callable[..., Any]:
    run = fn or tool.run
    if run is None:
        raise ToolDefinitionError(
            f"tool {tool.name!r} has no run hook and no fn was given", tool=tool.name
        )
    return run
