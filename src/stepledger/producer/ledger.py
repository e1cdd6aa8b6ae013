"""The SDK: a Ledger hands out workflow handles whose steps bracket tool calls durably.

A step's intent is acknowledged by Kafka before the tool is called, and its outcome
(success or the raised error) is acknowledged after.  Each call waits only for its own
records, so many agents in one process (threads or coroutines) never serialise.

``Ledger.workflow`` starts a workflow or, when its id is already in the log, resumes it:
steps with a recorded outcome return it without calling the tool again, steps in doubt
are settled first (see :mod:`stepledger.producer.settling`), and the saga rules of the
tools (pivots, approvals) are enforced on every step.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from stepledger.config import Settings
from stepledger.deadletters.events import EventLetterSink, KafkaEventLetters, MemoryEventLetters
from stepledger.deadletters.letter import max_message_bytes
from stepledger.domain import oversize
from stepledger.domain.events import Event
from stepledger.domain.factory import Clock, EventFactory, utc_now
from stepledger.domain.saga import PlanStep
from stepledger.domain.secrets import RedactionKey
from stepledger.domain.tools import Tool
from stepledger.history.adapt import HistoryReader, WorkflowReader, as_history
from stepledger.history.kafka import KafkaHistory
from stepledger.history.memory import InMemoryHistory
from stepledger.history.protocol import WorkflowHistory
from stepledger.kafka import DurableProducer
from stepledger.log import EventLog, InMemoryEventLog, KafkaEventLog
from stepledger.producer import opening
from stepledger.producer.fleetbudget import (
    BudgetLog,
    FleetBudgets,
    InMemoryBudgetLog,
    KafkaBudgetLog,
)
from stepledger.producer.opening import STAGE, WorkflowSpec
from stepledger.producer.session import ResumeOptions
from stepledger.producer.workflow import ToolFn, Workflow, plan_step
from stepledger.resolution.hooks import HookPool
from stepledger.resolution.registry import ToolRegistry
from stepledger.timer import SYSTEM_TIMER, Timer
from stepledger.wire import stepledger_version

T = TypeVar("T")


class Ledger:
    """Entry point of the SDK: one per process, shared by every agent in it."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        log: EventLog | None = None,
        clock: Clock = utc_now,
        tools: ToolRegistry | Iterable[Tool] | None = None,
        reader: WorkflowHistory | WorkflowReader | None = None,
        dead_letters: EventLetterSink | None = None,
        options: ResumeOptions | None = None,
        timer: Timer = SYSTEM_TIMER,
        hooks: HookPool | None = None,
        budget_log: BudgetLog | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools or ())
        key = _redaction_key(self.settings)
        for tool in self.tools:
            tool.ensure_bindable(key)  # refused before a client is made or anything runs
        self.log: EventLog = log if log is not None else _kafka_log(self.settings)
        self.clock = clock
        self.events = EventFactory(
            self.settings.fleet_id,
            self.settings.producer_id,
            clock,
            key,
            app_version=self.settings.app_version,
            stepledger_version=stepledger_version(),
        )
        self.options = options or ResumeOptions()
        self.timer = timer
        """The monotonic clock of this process: runners' budgets and settling's waits."""
        self.hooks = hooks
        """Where settling runs recovery hooks (None: the process's shared pool)."""
        self._history = None if reader is None else as_history(reader)
        self._dead_letters = dead_letters
        self._open_pool: ThreadPoolExecutor | None = None
        self._record_limit: int | None = None
        self._budget_log = budget_log
        self._fleet_budgets: FleetBudgets | None = None
        self._fleet_lock = threading.Lock()

    @property
    def record_limit(self) -> int:
        """The most bytes a recorded result may take: under the producer's limit and, on
        Kafka, the step log's own ``max.message.bytes`` (read once, at the first outcome)."""
        if self._record_limit is None:
            topic = self.settings.topic if isinstance(self.log, KafkaEventLog) else None
            self._record_limit = oversize.record_limit(max_message_bytes(self.settings, topic))
        return self._record_limit

    @property
    def history(self) -> WorkflowHistory:
        """How workflows are read back: their step log's history, unless a reader was given."""
        if self._history is None:
            if isinstance(self.log, InMemoryEventLog):
                self._history = InMemoryHistory(self.log)
            elif self.settings.projection:
                # O(the workflow): its rows in the snapshot, then its partition's tail.
                projection = self.settings.projection
                self._history = KafkaHistory(self.settings, snapshot=projection, clock=self.clock)
            else:
                # On this ledger's clock: a resume judges deadlines on the broker's append
                # times taken to it (``History.appended``), as settling compares them.
                self._history = KafkaHistory(self.settings, clock=self.clock)
        return self._history

    @property
    def fleet_budgets(self) -> FleetBudgets:
        """This process's reservations on its fleet's budget topic (made on first use)."""
        with self._fleet_lock:
            if self._fleet_budgets is None:
                log = self._budget_log
                if log is None and isinstance(self.log, KafkaEventLog):
                    log = KafkaBudgetLog(self.settings, self.log.codec, self.log.producer)
                elif log is None:
                    log = InMemoryBudgetLog()
                self._budget_log = log
                self._fleet_budgets = FleetBudgets(log, self.events, self.settings.fleet_id)
            return self._fleet_budgets

    @property
    def reader(self) -> WorkflowReader:
        """The history behind the older ``read -> list[Event]`` surface (deprecated: use
        :attr:`history`)."""
        return HistoryReader(self.history)

    @property
    def dead_letters(self) -> EventLetterSink:
        """Where dead-lettered workflows are published (the dead-letter topic by default)."""
        if self._dead_letters is None:
            if isinstance(self.log, InMemoryEventLog):
                self._dead_letters = MemoryEventLetters()
            else:
                from stepledger.log import codec_for

                self._dead_letters = KafkaEventLetters(
                    self.settings, codec_for(self.settings), stage=STAGE
                )
        return self._dead_letters

    def workflow(
        self,
        workflow_id: str,
        *,
        name: str = "",
        read_only: bool = False,
        max_attempts: int = 5,
        plan: Sequence[PlanStep | tuple[str, Tool]] | None = None,
        reason: str | None = None,
    ) -> Workflow:
        """Start the workflow, or resume it if its id is in the log (see the module doc).

        ``plan``, when given, is checked with ``check_plan`` before anything is recorded:
        a violation raises SagaViolationError naming every problem.  Resuming a workflow
        past its ``max_attempts`` dead-letters it and raises WorkflowDeadLetteredError.
        """
        spec = _spec(name, read_only, max_attempts, plan, reason)
        return opening.open_workflow(self, workflow_id, spec)

    async def aworkflow(
        self,
        workflow_id: str,
        *,
        name: str = "",
        read_only: bool = False,
        max_attempts: int = 5,
        plan: Sequence[PlanStep | tuple[str, Tool]] | None = None,
        reason: str | None = None,
    ) -> Workflow:
        """:meth:`workflow` for asyncio: reading and settling run off the event loop.

        A first run's started event is recorded on the loop, as :meth:`astart` records it.
        """
        spec = _spec(name, read_only, max_attempts, plan, reason)
        return await opening.aopen_workflow(self, workflow_id, spec, self._pool())

    async def off_loop(self, fn: Callable[..., T], /, *args: Any) -> T:
        """Run ``fn(*args)``, which waits on the log or a person, on this ledger's threads.

        Not asyncio.to_thread: its default pool has min(32, cores + 4) threads (6 on two
        cores), shared with the application's own work, so agents on one loop waiting for
        approvals, reads back or acknowledgements queued behind each other there.  Every
        blocking part of an asyncio step, open and turn goes through here.
        """
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await loop.run_in_executor(self._pool(), call)

    def _pool(self) -> ThreadPoolExecutor:
        with self._fleet_lock:
            if self._open_pool is None:
                self._open_pool = ThreadPoolExecutor(_BLOCKING_THREADS, "stepledger-wait")
            return self._open_pool

    def start(
        self, workflow_id: str, *, name: str = "", read_only: bool = False, max_attempts: int = 5
    ) -> Workflow:
        """Start a new workflow without reading the log: its started event is durable on return."""
        workflow = Workflow(self, workflow_id)
        workflow.record(self._started(workflow, name, read_only, max_attempts))
        return workflow

    async def astart(
        self, workflow_id: str, *, name: str = "", read_only: bool = False, max_attempts: int = 5
    ) -> Workflow:
        """Start a new workflow (asyncio)."""
        workflow = Workflow(self, workflow_id)
        await workflow.arecord(self._started(workflow, name, read_only, max_attempts))
        return workflow

    def _started(self, workflow: Workflow, name: str, read_only: bool, max_attempts: int) -> Event:
        """The first run's claim, naming the handle's runner."""
        return self.events.workflow_started(
            workflow.workflow_id,
            name=name,
            attempt=1,
            read_only=read_only,
            max_attempts=max_attempts,
            runner=workflow.runner,
        )

    def close(self) -> None:
        """Flush and close the event log, the reader and the dead-letter producer."""
        self.log.close()
        if self._history is not None:
            self._history.close()
        if self._dead_letters is not None:
            self._dead_letters.close()
        if self._open_pool is not None:
            self._open_pool.shutdown(wait=False)
        if isinstance(self._budget_log, KafkaBudgetLog):
            self._budget_log.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Threads that wait for asyncio agents (``off_loop``): on the log, a person, an ack.
_BLOCKING_THREADS = 64

#: Connect to every broker as soon as metadata names them, not when a request needs one:
#: the idempotent producer's first id request then finds a broker up, and a resume's
#: first durable write (after ``connect()`` and the read) does not wait out librdkafka's
#: producer-id retry timer.
LEDGER_PRODUCER = {"enable.sparse.connections": False}


def _spec(
    name: str,
    read_only: bool,
    max_attempts: int,
    plan: Sequence[PlanStep | tuple[str, Tool]] | None,
    reason: str | None,
) -> WorkflowSpec:
    steps = None if plan is None else tuple(plan_step(s) for s in plan)
    return WorkflowSpec(name, read_only, max_attempts, steps, reason)


def _redaction_key(settings: Settings) -> RedactionKey | None:
    key = settings.redaction_key
    return None if key is None else RedactionKey(key.get_secret_value())


def _kafka_log(settings: Settings) -> KafkaEventLog:
    producer = DurableProducer(settings, **LEDGER_PRODUCER)
    return KafkaEventLog(settings, producer=producer)


__all__ = ["Ledger", "ToolFn", "Workflow"]
