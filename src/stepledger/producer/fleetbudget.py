"""A fleet's model budget on its budget topic: reserve before a turn, settle after it.

The decision is the log's (:mod:`stepledger.domain.fleetbudget`): a runner appends its
reservation, reads the topic's partition back through that record (the claim-then-read-back
of a step's intent) and folds it; the reservation is granted or refused by its place in the
partition's order, the same for every reader.  One :class:`FleetBudgets` per
:class:`~stepledger.producer.ledger.Ledger` keeps the fold and its position, so each
read-back reads only what was appended since the last one.

When the topic cannot be written or read back in time, the reservation is not decided and
the turn is refused with the broker's error (DurabilityError, BrokerError): the model is
never asked on a spend the log has not ordered.  A settlement that cannot be written is
logged and left out: the reservation then counts its estimate.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from stepledger import wire
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.factory import EventFactory
from stepledger.domain.fleetbudget import FleetBudget, FleetSpend
from stepledger.errors import BudgetExceededError, CodecError, DurabilityError, StepLedgerError
from stepledger.kafka import DurableProducer, topic_partitions
from stepledger.kafka.reader import PartitionReader
from stepledger.kafka.records import BEGINNING
from stepledger.log import codec_for, event_headers

logger = logging.getLogger(__name__)

#: How often a refused turn waiting for a raise reads the budget topic.
_RAISE_POLL_S = 0.2
#: Raises one turn waits through at most (each may still fall short of its estimate).
_MOST_RAISES = 100


class BudgetLog(Protocol):
    """The budget topic: durable appends, and reads of one partition in order."""

    def append(self, event: ev.Event) -> tuple[int, int]:
        """Append one record, wait for its acknowledgement: (partition, offset)."""
        ...

    def read(self, partition: int, start: int, through: int) -> list[ev.Event]:
        """The partition's records from offset ``start`` through ``through``, in order."""
        ...

    def read_to_end(self, partition: int, start: int) -> tuple[list[ev.Event], int]:
        """The partition's records from ``start`` to its end now, and the offset after them."""
        ...


class InMemoryBudgetLog:
    """A budget topic in memory (one partition), for tests; ``fail`` refuses every append."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []
        self.fail = False
        self._lock = threading.Lock()

    def append(self, event: ev.Event) -> tuple[int, int]:
        """Append one record (or raise DurabilityError when ``fail`` is set)."""
        if self.fail:
            raise DurabilityError("in-memory budget log set to fail")
        with self._lock:
            self.events.append(event)
            return 0, len(self.events) - 1

    def read(self, partition: int, start: int, through: int) -> list[ev.Event]:
        """The records from ``start`` through ``through``."""
        with self._lock:
            return list(self.events[start : through + 1])

    def read_to_end(self, partition: int, start: int) -> tuple[list[ev.Event], int]:
        """The records from ``start`` on, and the offset after them."""
        with self._lock:
            return list(self.events[start:]), len(self.events)


class KafkaBudgetLog:
    """The budget topic on Kafka: the ledger's durable producer and one partition reader."""

    def __init__(self, settings: Settings, codec: Codec, producer: DurableProducer) -> None:
        self.settings = settings
        self._codec = codec
        self._producer = producer
        self._reader = PartitionReader(
            settings,
            group=settings.group(wire.BUDGET_READER_ROLE),
            what=f"reading the budget topic {settings.budget_topic}",
        )

    def append(self, event: ev.Event) -> tuple[int, int]:
        """Append one record keyed by its fleet (one partition orders a fleet's spends)."""
        key, value = event.fleet_id.encode(), self._codec.encode(event)
        where = self._producer.append(self.settings.budget_topic, key, value, event_headers(event))
        return where.partition, where.offset

    def read(self, partition: int, start: int, through: int) -> list[ev.Event]:
        """The records from ``start`` through ``through`` (BrokerError past the durable timeout)."""
        return self._read(partition, start, through)[0]

    def read_to_end(self, partition: int, start: int) -> tuple[list[ev.Event], int]:
        """The records from ``start`` to the end the partition reports now."""
        return self._read(partition, start, None)

    def _read(self, partition: int, start: int, through: int | None) -> tuple[list[ev.Event], int]:
        where = (self.settings.budget_topic, partition)
        found: list[ev.Event] = []
        after = start
        within = self.settings.durable_timeout_s
        bound = None if through is None else {where: through}
        for batch in self._reader.to_end({where: start or BEGINNING}, within=within, through=bound):
            for record in batch:
                after = record.offset + 1
                try:
                    found.append(self._codec.decode(record.value))
                except CodecError as exc:  # a foreign record decides nothing
                    logger.warning("budget topic offset %d undecodable: %s", record.offset, exc)
        return found, after

    def close(self) -> None:
        """Close the reader (the producer is the ledger's)."""
        self._reader.close()


@dataclass(frozen=True, slots=True)
class Held:
    """A granted reservation: what to settle after the turn."""

    event_id: str
    workflow_id: str
    step_id: str | None
    tokens: int
    cost: float


class FleetBudgets:
    """One process's reservations against its fleet's budget topic (thread-safe)."""

    def __init__(self, log: BudgetLog, events: EventFactory, fleet_id: str) -> None:
        self.log = log
        self.events = events
        self.spend = FleetSpend(fleet_id)
        """The topic folded so far (this fleet's records)."""
        self._next: dict[int, int] = {}
        """Per partition, the first offset not folded yet."""
        self._partition = 0
        """The partition this fleet's records land in (as the last append said)."""
        self._lock = threading.Lock()

    def reserve(
        self, budget: FleetBudget, workflow_id: str, step_id: str | None, runner: str | None
    ) -> Held:
        """Reserve one turn's estimate; BudgetExceededError when the log's order refuses it.

        With ``budget.wait_s``, a refused turn waits that long for a person's raise (a
        ``budget_raised`` on the topic after the refusal) and reserves again once it came.
        """
        deadline = time.monotonic() + budget.wait_s
        refused: BudgetExceededError | None = None
        for _ in range(_MOST_RAISES):
            outcome = self._reserve(budget, workflow_id, step_id, runner)
            if isinstance(outcome, Held):
                return outcome
            refused, raised = outcome
            if budget.wait_s <= 0 or not self._raised_since(raised, refused, deadline):
                raise refused
        assert refused is not None  # the loop ran: every pass reserved once
        raise refused

    def _raised_since(
        self, raised: tuple[int, float], refused: BudgetExceededError, deadline: float
    ) -> bool:
        """Wait until the topic holds a raise newer than ``raised`` (False: none in time)."""
        fleet = self.spend.fleet_id
        logger.warning(
            "%s; waiting %.0f s for a person to raise it (stepledger budget raise --fleet %s "
            "--tokens N)",
            refused.message,
            max(0.0, deadline - time.monotonic()),
            fleet,
        )
        while time.monotonic() < deadline:
            with self._lock:
                start = self._next.get(self._partition, 0)
                events, after = self.log.read_to_end(self._partition, start)
                self.spend.apply_all(events)
                self._next[self._partition] = max(start, after)
                if (self.spend.raised_tokens, self.spend.raised_cost) != raised:
                    return True
            time.sleep(min(_RAISE_POLL_S, max(0.0, deadline - time.monotonic())))
        return False

    def _reserve(
        self, budget: FleetBudget, workflow_id: str, step_id: str | None, runner: str | None
    ) -> Held | tuple[BudgetExceededError, tuple[int, float]]:
        """The granted reservation, or the refusal with the raises folded through it (only
        a raise after it in the log can let a retry pass)."""
        body = ev.BudgetReserved(
            tokens=budget.per_turn_tokens,
            cost=budget.per_turn_cost,
            limit_tokens=budget.tokens,
            limit_cost=budget.cost,
            runner=runner,
        )
        # Each reservation is a request of its own (a resumed turn reserves anew).
        event = self.events.envelope(workflow_id, step_id, body, uuid.uuid4().hex)
        partition, offset = self.log.append(event)
        self._partition = partition
        with self._lock:
            self._catch_up(partition, offset)
            granted = self.spend.decision(event.event_id)
            tokens, cost = self.spend.tokens, self.spend.cost
            why = None if granted else self.spend.refusal(body.tokens, body.cost, budget)
            raised = (self.spend.raised_tokens, self.spend.raised_cost)
        if granted:
            return Held(event.event_id, workflow_id, step_id, body.tokens, body.cost)
        fleet = self.spend.fleet_id
        error = BudgetExceededError(
            f"fleet {fleet!r} {why or 'budget refused the turn'}: the model is not asked; "
            "raise the fleet's budget (FleetBudget, or "
            f"`stepledger budget raise --fleet {fleet} --tokens N`)",
            workflow_id=workflow_id,
            spent_tokens=tokens,
            spent_cost=cost,
            limit=why or "fleet budget",
            fleet_id=fleet,
        )
        return error, raised

    def settle(self, held: Held, tokens: int, cost: float) -> None:
        """Record what the turn spent; a failure is logged (the estimate then stands)."""
        body = ev.BudgetSettled(reservation=held.event_id, tokens=tokens, cost=cost)
        event = self.events.envelope(held.workflow_id, held.step_id, body)
        try:
            self.log.append(event)
        except StepLedgerError as exc:
            logger.warning(
                "could not settle budget reservation %s (%s): it counts its estimate of %d tokens",
                held.event_id,
                exc,
                held.tokens,
            )

    def _catch_up(self, partition: int, through: int) -> None:
        start = self._next.get(partition, 0)
        if through < start:
            return
        self.spend.apply_all(self.log.read(partition, start, through))
        self._next[partition] = through + 1


def raise_on(log: BudgetLog, fleet: str, producer_id: str, body: ev.BudgetRaised) -> FleetSpend:
    """Append a person's raise of ``fleet``'s budget; the fleet's spend read back through it
    (the command line's and the inbox's one path)."""
    events = EventFactory(fleet, producer_id)
    partition, offset = log.append(events.envelope(fleet, None, body, uuid.uuid4().hex))
    spend = FleetSpend(fleet)
    spend.apply_all(log.read(partition, 0, offset))
    return spend


def raise_budget(settings: Settings, fleet: str, body: ev.BudgetRaised) -> FleetSpend:
    """:func:`raise_on` the settings' budget topic."""
    producer = DurableProducer(settings)
    log = KafkaBudgetLog(settings, codec_for(settings), producer)
    try:
        return raise_on(log, fleet, settings.producer_id, body)
    finally:
        log.close()
        producer.close()


def fleet_spend(settings: Settings, fleet: str) -> FleetSpend:
    """``fleet``'s budget topic folded to its end now (the CLI's ``budget show``)."""
    producer = DurableProducer(settings)  # made lazily: nothing is produced
    log = KafkaBudgetLog(settings, codec_for(settings), producer)
    spend = FleetSpend(fleet)
    try:
        for partition in topic_partitions(settings, settings.budget_topic):
            spend.apply_all(log.read_to_end(partition, 0)[0])
        return spend
    finally:
        log.close()
