"""The checkpointer daemon: a member of the group ``<step log>.checkpointer``.

Like the projector and the recovery daemon, checkpointers split the step log's partitions
through their consumer group (incremental, ``cooperative-sticky`` or KIP-848; static
membership with an instance id): start as many as you like, kill any, add more.  On
assignment a member restores each partition's checkpoints, directory and progress from the
checkpoint topic and reads the step log from the record after the progress; on revocation
it writes a last round for the partition (its checkpoints, directory and progress, while the
partition is still its own) and forgets it; a partition *lost* (taken while the member was
away) is forgotten without a write.  No offset is committed: the progress on the checkpoint
topic is where a partition resumes.

A zombie (a member paused past its session, whose partitions moved) must not write over its
successor.  Kafka has no conditional write without transactions, so the member writes only
while its fence says it owns the partition (:class:`~stepledger.kafka.fence.Fence`: it
polled within the session, and after a longer gap not before the group had time to answer):
a member woken from a pause writes nothing until the group told it what it still owns.  The
directory records carry no epoch or generation, because none is needed for correctness:
every checkpoint is a function of the log up to its covered offset, and every root lists
only checkpoints acknowledged before it, so a root written late by a zombie (a record
already in flight) is an older snapshot that is still true.  Readers follow the newest root,
check every record it names (key, offset, log) and read the tail after it, falling back to
reading the partition for anything they cannot prove; and the new owner writes every chunk
and a root of its own at its first round.  An epoch could not stop the write, and a reader
would have to read past the newest root to find a higher one.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from stepledger import wire
from stepledger.checkpoints.writer import Checkpointer
from stepledger.daemon.health import Health
from stepledger.kafka.consumer import GroupConsumer, GroupProtocol, Membership, Placement
from stepledger.kafka.fence import Fence
from stepledger.kafka.records import Where
from stepledger.kafka.watch import BrokerWatch, client_logger
from stepledger.wire import client_id

logger = logging.getLogger("stepledger.checkpoints")

#: Records taken per poll, and how long a poll waits for them.
_BATCH = 1000
_POLL_S = 0.05


class Stop(Protocol):
    """Asked every turn: stop when requested (a :class:`~stepledger.daemon.process.Shutdown`)."""

    @property
    def requested(self) -> bool: ...


def membership(
    checkpointer: Checkpointer,
    *,
    session_timeout_s: float = 6.0,
    instance_id: str | None = None,
    protocol: GroupProtocol | None = None,
) -> Membership:
    """How a checkpointer takes part in its group, ``<step log>.checkpointer``."""
    return Membership(
        group=checkpointer.settings.group(wire.CHECKPOINTER_ROLE),
        session_timeout_s=session_timeout_s,
        protocol=protocol,
        instance_id=instance_id,
        client_id=client_id("checkpointer"),
    )


class Member:
    """A checkpointer in its consumer group: partitions come and go with the group."""

    def __init__(
        self, checkpointer: Checkpointer, member: Membership, health: Health | None = None
    ) -> None:
        self.checkpointer = checkpointer
        self.membership = member
        self.health = health
        self.fence = Fence(*member.fence_timing)
        checkpointer.fence = self.fence
        self.joined = False
        """An assignment (even an empty one) arrived: the member is in its group."""
        self.watch = BrokerWatch(logger)

    def run(self, stop: Stop, *, max_seconds: float | None = None) -> None:
        """Follow the group's partitions until ``stop.requested``, a round every ``every_s``."""
        checkpointer = self.checkpointer
        consumer = GroupConsumer(
            checkpointer.settings,
            self.membership,
            error_cb=self.watch.on_error,
            logger=client_logger("stepledger.checkpoints.kafka"),
        )
        consumer.subscribe(
            [checkpointer.settings.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        began = last = time.monotonic()
        logger.info("checkpointer started in group %s", self.membership.group)
        try:
            while not stop.requested:
                if max_seconds is not None and time.monotonic() - began >= max_seconds:
                    break
                polled = consumer.poll(_BATCH, _POLL_S)
                self.fence.polled()
                if polled.answered:
                    self.watch.reachable()
                elif self.watch.should_probe() and consumer.reachable(checkpointer.settings.topic):
                    self.watch.reachable()  # an idle topic sends nothing: its metadata answered
                if self.health is not None:
                    self.health.beat()
                for record in polled.records:
                    checkpointer.take(record)
                if time.monotonic() - last >= checkpointer.options.every_s:
                    checkpointer.round()
                    last = time.monotonic()
                    if self.health is not None:
                        self.health.report(self.unready())
            checkpointer.round()
        finally:
            consumer.close()  # leaves the group: what is still held is revoked (a last round)

    def unready(self) -> str | None:
        """Why the member is not ready (/readyz): not in its group yet, or its partitions'."""
        if not self.watch.up:
            return "the checkpointer cannot reach the broker"
        if not self.joined:
            return "the checkpointer has no partitions assigned yet"
        return self.checkpointer.unready()

    def _on_assign(self, partitions: list[Where]) -> Placement:
        numbers = [number for _, number in partitions]
        starts = self.checkpointer.restore(numbers)
        self.fence.assigned(set(numbers))
        self.joined = True
        logger.info("partitions assigned: %s", sorted(numbers))
        return Placement(starts)

    def _on_revoke(self, partitions: list[Where]) -> None:
        numbers = {number for _, number in partitions}
        self.checkpointer.release(numbers)  # still ours until this returns: a last round
        self.fence.revoked(numbers)
        logger.info("partitions revoked: %s", sorted(numbers))

    def _on_lost(self, partitions: list[Where]) -> None:
        numbers = {number for _, number in partitions}
        self.fence.revoked(numbers)  # their new owner may have written since: nothing of ours
        self.checkpointer.drop(numbers)
        logger.info("partitions lost: %s", sorted(numbers))
