"""The recovery daemon: follow the log in a consumer group and resolve steps left in doubt.

One loop on the main thread reads events, folds them into the tracked steps (log order
decides), checkpoints, and hands due steps to a small pool of workers that run the
:class:`~stepledger.resolution.resolver.Resolver` on a copy of the step.  A worker's events
reach the daemon's state only when they are read back from the log, and the step is not
judged again before then, so a decision is never taken twice from a stale state.  A
compensation (the one decision whose hook has an effect) is carried out only after the loop
read its claim back and the fold took it as the step's first decision: a daemon that lost
the partition, was paused, or raced a resuming agent runs no hook (see ``claims``).  A
compensation an agent began on a step the daemon no longer tracks (a saga unwinding a step
that succeeded) reopens the step: past its deadline plus the grace, its workflow is read
back on a worker and the step is tracked again if the log's fold leaves it compensating
(``reopen``, ``histories``), and the compensation is carried through as any other.  The
same read stands before any decision on a step of a workflow whose claims the daemon does
not know (a partition taken over from a checkpoint taken after the workflow's latest claim,
a claim forgotten to stay within the bound), and before a compensation claim of a workflow
whose first claim it only assumed (a start read after a take-over may have lost to one
before it): a fenced-off runner's intent then looks live to the daemon's fold, never to
the log's.

Partitions: on assignment a partition's checkpoint is loaded and the consumer seeks to
its stored offset (a partition never checkpointed by this group is replayed from the
beginning); nothing is resolved on a partition before its end was reached once, so steps
decided just before a restart are seen decided.  On revocation the daemon waits for its
running resolutions there, checkpoints and forgets the partition.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from concurrent.futures import Future
from datetime import datetime, timedelta

from stepledger import tracing
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.daemon.health import partitions_unready
from stepledger.daemon.process import Shutdown
from stepledger.deadletters.events import EventLetterSink, KafkaEventLetters
from stepledger.deadletters.letter import max_message_bytes
from stepledger.domain import events as ev
from stepledger.domain import ids, oversize
from stepledger.domain import resolution as rs
from stepledger.domain.factory import Clock, EventFactory, utc_now
from stepledger.domain.state import StepState, replay
from stepledger.errors import OwnershipLostError, StepLedgerError
from stepledger.history.adapt import WorkflowReader, as_history
from stepledger.history.kafka import KafkaHistory
from stepledger.history.protocol import WorkflowHistory
from stepledger.kafka import reachable_partitions
from stepledger.kafka.consumer import GroupConsumer, Placement
from stepledger.kafka.fence import Fence
from stepledger.kafka.gaps import Gap, LogStart, report_gap
from stepledger.kafka.records import BEGINNING, Consumed, Polled, Where
from stepledger.kafka.topics import check_retention
from stepledger.kafka.watch import BrokerWatch, client_logger
from stepledger.log import EventLog, KafkaEventLog, codec_for
from stepledger.recovery.changelog import KafkaCheckpointStore
from stepledger.recovery.checkpoint import CheckpointStore
from stepledger.recovery.claims import ClaimBoard
from stepledger.recovery.clock import DeadlineClock, SteadyClock
from stepledger.recovery.echoes import Echoes
from stepledger.recovery.fence import FencedLog
from stepledger.recovery.groups import warn_other_groups
from stepledger.recovery.health import write_health
from stepledger.recovery.histories import HistoryReads
from stepledger.recovery.metrics import RecoveryMetrics
from stepledger.recovery.options import DaemonOptions
from stepledger.recovery.tracker import LateOutcome, StepKey, Tracker
from stepledger.recovery.work import WorkPool
from stepledger.resolution.registry import ToolRegistry
from stepledger.resolution.resolver import Resolution, Resolver, Settle
from stepledger.timer import SYSTEM_TIMER, Timer
from stepledger.wire import client_id

logger = logging.getLogger(__name__)
#: A tracked step's events as handed to a worker.
Events = tuple[ev.Event, ...]
#: Changes to tracked steps after which a checkpoint is taken before its interval is up.
#: A checkpoint writes each changed step's lines on the loop (then the store's write), so
#: however many intents a burst or a catch-up brings between two intervals (a larger
#: ``batch_size``, a faster machine), one checkpoint holds the loop about as long as
#: folding a poll of 1,000 records does.
CHECKPOINT_AFTER_CHANGES = 2048


class RecoveryDaemon:
    """Follows the log, tracks open intents and resolves them past deadline + grace."""

    def __init__(
        self,
        settings: Settings,
        tools: ToolRegistry,
        options: DaemonOptions,
        *,
        log: EventLog | None = None,
        store: CheckpointStore | None = None,
        dead_letters: EventLetterSink | None = None,
        metrics: RecoveryMetrics | None = None,
        codec: Codec | None = None,
        clock: Clock = utc_now,
        shutdown: Shutdown | None = None,
        reader: WorkflowHistory | WorkflowReader | None = None,
        timer: Timer | None = None,
    ) -> None:
        options = options.for_settings(settings)
        self.settings, self.tools, self.options, self.clock = settings, tools, options, clock
        # Arrivals and due times run on a clock that never steps (recovery.clock); the wall
        # clock stays for the timestamps written.  A wall clock given without a timer (a
        # test moving time by hand) is taken as that clock itself.
        steady_given = timer is not None or clock is utc_now
        self.steady: Clock = SteadyClock(clock, timer or SYSTEM_TIMER) if steady_given else clock
        self.codec = codec or codec_for(settings)
        self.log = log or KafkaEventLog(settings, codec=self.codec)
        options.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = store or KafkaCheckpointStore(settings, options.group)
        self.dead_letters = dead_letters or KafkaEventLetters(
            settings, self.codec, group=options.group
        )
        self.metrics = metrics or RecoveryMetrics()
        self._log_start: LogStart | None = None
        self.metrics.broker_up.set(1)
        self.watch = BrokerWatch(
            logger, on_change=lambda up: self.metrics.broker_up.set(1 if up else 0)
        )
        self.shutdown = shutdown or Shutdown()
        self._claims = ClaimBoard(options.claim_timeout_s)
        # Its client id is wire.RECOVERY_CLIENT_ID/VERSION: other groups' daemons are told by it.
        self.membership = options.membership(client_id("recovery"))
        self.fence = Fence(*self.membership.fence_timing)
        grace = timedelta(seconds=options.grace_s)
        self.resolver = Resolver(
            FencedLog(self.log, self.fence),
            EventFactory(settings.fleet_id, settings.producer_id, clock),
            tools,
            dead_letters=self.dead_letters,
            clock=clock,
            steady=self.steady,
            grace=grace,
            retry_base_s=options.retry_base_s,
            observer=self.metrics.observe,
            confirm=self._claims.wait,
            pipeline=True,
            record_limit=oversize.record_limit(max_message_bytes(settings)),
        )
        self.tracker = Tracker(self._due, retain=timedelta(seconds=options.retain_s), grace=grace)
        self.deadlines = DeadlineClock()
        self.assigned: set[int] = set()
        self.joined = False
        """An assignment (even an empty one) arrived: the member is in its group."""
        self.events_read = 0
        self.caught_up: set[int] = set()
        """Partitions whose end was reached once, with every record before it tracked."""
        self.pending_late: dict[str, LateOutcome] = {}
        self.work = WorkPool(options.workers, options.queue_per_worker, self.fence)
        # Reopened steps' workflows are read through the SDK's history (no client made yet).
        self.histories = HistoryReads(
            self.tracker,
            KafkaHistory(settings, self.codec, role="recovery")
            if reader is None
            else as_history(reader),
            self.steady,
            on_given_up=self.metrics.poison.inc,
        )
        self.echoes = Echoes(settings.topic)
        # Never yet: -inf, not 0.0, so the first turn acts on a host up for less than an interval
        # (the monotonic clock counts from boot).
        self._last_checkpoint = self._last_health = self._last_sweep = -math.inf

    # -- the loop ----------------------------------------------------------------------

    def run(self, *, max_seconds: float | None = None) -> None:
        """Run until shutdown is requested (or ``max_seconds`` passed), then stop cleanly."""
        # Fail at once, in one line, on an unreachable broker or a missing topic (as the
        # projector does) instead of logging connection errors forever while "healthy".
        reachable_partitions(self.settings, self.settings.topic)
        warn_other_groups(self.settings, self.options.group)
        check_retention(self.settings, "recovery")
        self.store.connect()
        # Decisions are fitted to the limit that applies: the step log's own, when smaller.
        limit = max_message_bytes(self.settings, self.settings.topic)
        self.resolver.record_limit = oversize.record_limit(limit)
        consumer = GroupConsumer(
            self.settings,
            self.membership,
            error_cb=self.watch.on_error,
            logger=client_logger("stepledger.recovery.kafka"),
        )
        consumer.subscribe(
            [self.settings.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        began = time.monotonic()
        logger.info(
            "recovery started", extra={"group": self.options.group, "topic": self.settings.topic}
        )
        try:
            while not self.shutdown.requested:
                if max_seconds is not None and time.monotonic() - began > max_seconds:
                    break
                self.tick(consumer)
        finally:
            self._stop(consumer)

    def tick(self, consumer: GroupConsumer) -> None:
        """One turn: read a batch, collect finished work, checkpoint, dispatch due work."""
        self.metrics.health.beat()
        wait = self._wait_time()
        polled: Polled = consumer.poll(self.options.batch_size, wait)
        self.fence.polled()
        if polled.answered:
            self.watch.reachable()
        elif self.watch.should_probe() and consumer.reachable(self.settings.topic):
            # An idle topic sends nothing back: its metadata tells that the broker is up.
            self.watch.reachable()
        for msg in polled.records:
            self._handle(msg)
        # A partition counts as caught up only once the records read before its end are
        # folded in: a reader on another thread (health, the bench, an embedding program)
        # that sees it caught up sees the tail's steps tracked, never half a batch.
        self.caught_up.update(partition for _, partition in polled.at_end)
        self._collect()
        now = time.monotonic()
        if (
            now - self._last_checkpoint >= self.options.checkpoint_interval_s
            or self.tracker.changed >= CHECKPOINT_AFTER_CHANGES
        ):
            self.checkpoint(sweep=now - self._last_sweep >= 30.0)
        self._dispatch()
        if now - self._last_health >= self.options.health_interval_s:
            self._health()

    def _wait_time(self) -> float:
        # While work is out, come back quickly to collect it; otherwise sleep in the poll
        # until the next step falls due, so a deadline is acted on within milliseconds.
        if self.work.inflight:
            return 0.005
        wait = self.options.poll_timeout_s
        upcoming = self.tracker.next_due()
        if upcoming is not None:
            wait = min(wait, max(0.001, (upcoming - self.steady()).total_seconds()))
        return wait

    def _handle(self, msg: Consumed) -> None:
        partition, offset = msg.partition, msg.offset
        try:
            event = self.echoes.take(msg) or self.codec.decode(msg.value)
        except StepLedgerError as exc:
            # Bad input is the projector's to dead-letter; recovery only moves past it.  A
            # record claiming another fleet (the codec is pinned to a fleet role's) is bad
            # input too: no decision is ever taken on it.
            logger.warning(
                "undecodable record skipped",
                extra={"offset": offset, "partition": partition, "error": str(exc)},
            )
            self.tracker.positions[partition] = offset + 1
            return
        self.metrics.events.inc()
        self.events_read += 1
        tracing.remember_intent(event, msg.headers)
        arrived = self._arrived(event, msg)
        try:
            late = self.tracker.apply(event, partition, offset, msg.value, arrived)
        except Exception as exc:
            # One event may at worst be skipped (the projector dead-letters what it cannot
            # project); the daemon and every other step of the partition go on.
            self.tracker.positions[partition] = offset + 1
            self.metrics.poison.inc()
            logger.error(
                "event skipped: it cannot be tracked",
                extra={
                    "partition": partition,
                    "offset": offset,
                    "event_id": event.event_id,
                    "error": f"{type(exc).__name__}: {exc}",
                },
            )
            return
        if late is not None:
            self.pending_late[late.event.event_id] = late
        if isinstance(event.body, ev.CompensationIntended) and event.step_id is not None:
            # A claim read back in log order: the fold says whether it was the first decision.
            key = (event.workflow_id, event.step_id)
            tracked = key in self.tracker.steps
            self._claims.post(event.event_id, self.tracker.snapshot(key) if tracked else None)

    # -- dispatching work --------------------------------------------------------------

    def _dispatch(self) -> None:
        self._dispatch_late()
        self.histories.dispatch(self.work, self.caught_up)
        free = self.work.free
        if free <= 0:
            return
        for key in self.tracker.due(self.steady(), free, self.caught_up):
            tracked = self.tracker.steps[key]
            events = self.tracker.events_of(key)
            self.work.submit(key, tracked, self._attempt, events, key[1], tracked.arrival)

    def _dispatch_late(self) -> None:
        for event_id, late in list(self.pending_late.items()):
            if self.work.free <= 0:
                return
            tracked = self.tracker.steps.get(late.key)
            if tracked is None:
                del self.pending_late[event_id]
                continue
            ready = self.tracker.ready(late.key)
            if ready is None or ready.partition not in self.caught_up:
                continue
            if tracked.status in rs.ACTIONABLE:
                continue  # judged once the step is decided again
            del self.pending_late[event_id]
            anomaly_id = ids.event_id(late.key[0], late.key[1], "anomaly_observed", event_id)
            events = self.tracker.events_of(late.key)
            if any(e.event_id == anomaly_id for e in events):
                continue  # judged before a restart: its record is already in the log
            self.work.submit(late.key, tracked, self._judge, events, late.event)

    def _attempt(
        self, workflow_id: str, events: Events, step_id: str, arrival: rs.Arrival | None
    ) -> Settle:
        # On the worker: its own fold of the (immutable) events is built there; the pool
        # waits for the last acknowledgements while the worker goes on to the next step.
        # The step is judged by when its events reached this daemon, as it was scheduled.
        settle = self.resolver.begin(replay(workflow_id, list(events)), step_id, arrival)
        return functools.partial(self._acknowledged, settle)

    def _acknowledged(self, settle: Settle) -> Resolution:
        # On the settling thread, before the resolution counts as finished: its events are
        # known where they landed before the consumer reads them back.
        resolution = settle()
        self.echoes.expect(resolution)
        return resolution

    def _judge(self, workflow_id: str, events: Events, outcome: ev.Event) -> Resolution:
        return self.resolver.judge_late(replay(workflow_id, list(events)), outcome)

    def _collect(self, *, wait: float = 0.0) -> None:
        """Take in the resolutions that finished (waiting up to ``wait`` s for the rest)."""
        self.work.collect(self._finished, wait=wait)

    def _finished(self, key: StepKey, future: Future[Resolution]) -> None:
        now = self.steady()
        if future.cancelled():
            return  # queued work for a partition that moved away
        try:
            resolution = future.result()
        except OwnershipLostError as exc:
            self.metrics.fenced.inc()
            logger.warning(
                "decision not appended: partition ownership in doubt",
                extra={"workflow_id": key[0], "step_id": key[1], "error": str(exc)},
            )
            self.tracker.release(key, echo_offset=-1, not_before=now + timedelta(seconds=1))
            return
        except Exception as exc:
            # Typically the log refused an append: try again after a pause.
            logger.error(
                "resolution failed",
                extra={
                    "workflow_id": key[0],
                    "step_id": key[1],
                    "error": f"{type(exc).__name__}: {exc}",
                },
            )
            self.tracker.release(key, echo_offset=-1, not_before=now + timedelta(seconds=1))
            return
        if resolution.lost:
            self.metrics.lost_claims.inc()
        echo = max((p.offset for p in resolution.positions), default=-1)
        pause = None if resolution.events else now + timedelta(milliseconds=100)
        self.tracker.release(key, echo_offset=echo, not_before=pause)
        if resolution.events:
            self._log_resolution(key, resolution)

    def _log_resolution(self, key: StepKey, resolution: Resolution) -> None:
        kinds = [e.type for e in resolution.events]
        if resolution.action.kind is rs.ActionKind.NONE and resolution.action.reason:
            self.metrics.late_outcomes.labels(verdict=resolution.action.reason).inc()
        logger.info(
            "step resolved",
            extra={
                "workflow_id": key[0],
                "step_id": key[1],
                "action": resolution.action.kind.value,
                "status": resolution.step.status.value,
                "events": kinds,
                "error": resolution.error,
            },
        )

    def _arrived(self, event: ev.Event, msg: Consumed) -> datetime | None:
        """When a step's event was appended, on this daemon's steady clock (one clock, never
        earlier than it was); None for an event of no step."""
        now, timestamp = self.steady(), msg.timestamp
        self.deadlines.observe(timestamp, now)
        if event.step_id is None:
            return None
        appended, _ = self.deadlines.appended(timestamp, now)
        if isinstance(event.body, ev.StepIntended):
            # Read while its partition was caught up: at once, not from a backlog.
            self.deadlines.measure(event, appended, msg.partition in self.caught_up)
            largest = self.deadlines.largest()
            if largest is not None:
                self.metrics.clock_skew.set(largest)
        return appended

    def _due(self, step: StepState, arrival: rs.Arrival | None) -> datetime | None:
        tool = self.tools.get(step.tool)
        return rs.due_at(
            step,
            tool,
            grace=self.resolver.grace,
            retry_base_s=self.options.retry_base_s,
            arrival=arrival,
        )

    # -- state, partitions, health ----------------------------------------------------

    def checkpoint(self, *, sweep: bool = False) -> None:
        """Write the tracked steps and positions changed since the last checkpoint.

        Only for partitions owned beyond doubt: a daemon back from a pause past its session
        holds its changes until the group has answered, so a partition that moved meanwhile
        never gets this daemon's stale state written over its new owner's checkpoint.
        """
        batch = self.tracker.take_batch(self.clock(), sweep=sweep, writable=self.fence.owns)
        self.store.save(self.settings.topic, batch)
        self._last_checkpoint = time.monotonic()
        if sweep:
            self._last_sweep = self._last_checkpoint

    def _on_assign(self, partitions: list[Where]) -> Placement:
        starts: dict[Where, int] = {}
        for topic, partition in partitions:
            checkpoint = self.store.load(topic, partition)
            offset = self.tracker.load(partition, checkpoint, self.steady())
            if offset is None:
                logger.warning(
                    "no checkpoint for %s[%d]: replaying the partition from offset 0",
                    topic,
                    partition,
                    extra={"topic": topic, "partition": partition},
                )
            starts[(topic, partition)] = BEGINNING if offset is None else offset
            gap = self._gap(topic, partition, offset or 0)
            if gap is not None:
                starts[(topic, partition)] = gap.log_start
                self.tracker.skipped(partition)  # the claims in the deleted head are unknown
            self.caught_up.discard(partition)
        for late in self.tracker.late:
            self.pending_late[late.event.event_id] = late
        self.tracker.late.clear()
        for (workflow_id, step_id), error in self.tracker.unloadable:
            self.metrics.poison.inc()
            logger.error(
                "checkpoint entry skipped: it cannot be loaded",
                extra={"workflow_id": workflow_id, "step_id": step_id, "error": error},
            )
        self.tracker.unloadable.clear()
        self.assigned |= {partition for _, partition in partitions}
        self.joined = True
        self.fence.assigned({partition for _, partition in partitions})
        self.metrics.partitions.set(len(self.assigned))
        logger.info(
            "partitions assigned",
            extra={"partitions": [[p, offset] for (_, p), offset in starts.items()]},
        )
        return Placement(starts)

    def _gap(self, topic: str, partition: int, expected: int) -> Gap | None:
        """A gap below the log start: one line and a count (its intents are never seen)."""
        if self._log_start is None:
            self._log_start = LogStart(self.settings)
        try:
            gaps = self._log_start.gaps({(topic, partition): expected})
        except StepLedgerError as exc:
            logger.warning("could not read the log start of %s[%d]: %s", topic, partition, exc)
            return None
        for gap in gaps:
            report_gap(gap, "recovery")
            self.metrics.records_lost.labels(topic, str(partition)).inc(gap.records_lost)
        return gaps[0] if gaps else None

    def _on_revoke(self, partitions: list[Where]) -> None:
        """Partitions are handed over in order: queued work dropped, running work finished."""
        gone = {partition for _, partition in partitions}
        self._cancel_queued(gone)
        # Still ours until this callback returns: let running resolutions append, briefly,
        # then hand the partitions over with their last checkpoint.
        if self.work.on(gone):
            self._collect(wait=min(self.options.drain_timeout_s, self.fence.session_s / 2))
        self.checkpoint()
        self.fence.revoked(gone)
        self._forget(gone, "partitions revoked")

    def _on_lost(self, partitions: list[Where]) -> None:
        """Partitions were taken while we were away: nothing more is appended for them."""
        gone = {partition for _, partition in partitions}
        self.fence.revoked(gone)
        self._cancel_queued(gone)
        # Their new owner may have checkpointed them since: nothing of ours is written over it.
        for partition in gone:
            self.tracker.drop_partition(partition)
        self._forget(gone, "partitions lost")

    def _cancel_queued(self, gone: set[int]) -> None:
        self.work.cancel(gone)
        self._collect()

    def _forget(self, gone: set[int], what: str) -> None:
        self.checkpoint()
        for partition in gone:
            self.tracker.drop_partition(partition)
            self.caught_up.discard(partition)
        self.assigned -= gone
        self.pending_late = {
            k: v for k, v in self.pending_late.items() if v.key in self.tracker.steps
        }
        self.metrics.partitions.set(len(self.assigned))
        logger.info(what, extra={"partitions": sorted(gone)})

    def _health(self) -> None:
        self._last_health = time.monotonic()
        open_count = self.tracker.open_count()
        self.metrics.open_intents.set(open_count)
        self.metrics.oldest_overdue.set(self.tracker.oldest_overdue_s(self.steady()))
        self.metrics.tracked_steps.set(len(self.tracker.steps))
        self.metrics.escalated_steps.set(self.tracker.escalated_count())
        self.metrics.last_loop.set_to_current_time()
        # Ready (/readyz) once in the group and every partition read to its end once.
        topic = self.settings.topic
        behind = {f"{topic}[{p}]": 0 if p in self.caught_up else None for p in self.assigned}
        self.metrics.health.report(
            partitions_unready(
                "recovery", joined=self.joined, behind=behind, broker_up=self.watch.up
            )
        )
        write_health(
            self.options.health_file,
            {
                "pid": os.getpid(),
                "group": self.options.group,
                "topic": self.settings.topic,
                "at": time.time(),
                "partitions": sorted(self.assigned),
                "caught_up": sorted(self.caught_up),
                "open_intents": open_count,
                "tracked_steps": len(self.tracker.steps),
                "events_read": self.events_read,
                "inflight": len(self.work.inflight),
                "broker_up": self.watch.up,
                "broker_down_s": self._outage_s(),
            },
        )

    def _outage_s(self) -> float:
        since = self.watch.down_since
        return 0.0 if since is None else round(time.monotonic() - since, 3)

    def _stop(self, consumer: GroupConsumer) -> None:
        self._collect(wait=self.options.drain_timeout_s)
        try:
            self.checkpoint()
        finally:
            consumer.close()
            self.work.shutdown()
            self.log.close()
            self.histories.close()
            self.dead_letters.close()
            self.store.close()
            self.options.health_file.unlink(missing_ok=True)
            logger.info("recovery stopped", extra={"signal": self.shutdown.signal})
