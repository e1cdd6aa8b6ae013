"""The recovery daemon's per-partition state on a compacted Kafka topic: its one state store.

One store whatever the deployment: one daemon or many, on one machine or several (nothing
is shared but Kafka), and each fleet's state under its step log's name.  The changelog
pattern: each step-log partition's state lives in the same partition number
of a compacted topic, one record per tracked step (key ``step`` + group + workflow + step;
the value the step's events as JSON lines; a tombstone when it is no longer tracked) and
one position record per group (key ``position`` + group; the value the next offset).  A
new owner of a partition reads that partition of the changelog to its end and follows the
step log from the stored position, wherever it runs.

Ordering instead of a transaction (Tansu's transactions are not to be trusted): a batch's
step records are acknowledged before its position record is sent.  A crash between the two
leaves step records newer than the position; the next owner then re-reads the step log from
the older position, and the fold ignores events it already holds (event ids), so the state
it ends with is the one the lost position would have given.

Every record names the step log in its ``stepledger_log`` header; a restore reads only the
records of its own log (:mod:`stepledger.kafka.logid`): a changelog shared with another
deployment, or one written for a step log since deleted and created again under the same
name, never moves a daemon's position nor gives it another log's steps.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future

from stepledger import wire
from stepledger.config import Settings
from stepledger.errors import ConfigError, RecoveryError, StepLedgerError
from stepledger.kafka import DurableProducer, Headers, Position, ensure_topics, topic_partitions
from stepledger.kafka.logid import LogIdentity, Refusals, resolve
from stepledger.kafka.reader import records_to_end
from stepledger.kafka.topics import COMPACTED
from stepledger.recovery.checkpoint import CheckpointBatch, PartitionCheckpoint, StepKey

#: Restoring a partition never takes longer than this.
RESTORE_LIMIT_S = 120.0


def _key(kind: str, group: str, *rest: str) -> bytes:
    return json.dumps([kind, group, *rest], separators=(",", ":")).encode()


class KafkaCheckpointStore:
    """Recovery checkpoints on a compacted topic partitioned like the step log."""

    def __init__(
        self,
        settings: Settings,
        group: str,
        topic: str | None = None,
        identity: LogIdentity | None = None,
    ) -> None:
        self.settings = settings
        self.group = group
        self.topic = topic or settings.recovery_state_topic
        self._identity = identity
        self._refusals: Refusals | None = None
        self._producer = DurableProducer(settings)
        self._lock = threading.Lock()

    @property
    def refusals(self) -> Refusals:
        """The changelog records restores refused (another step log's, or naming none)."""
        if self._refusals is None:
            self._identity = self._identity or resolve(self.settings)
            self._refusals = Refusals(self._identity, "recovery state")
        return self._refusals

    def connect(self) -> None:
        """Create the changelog if missing: compacted, with the step log's partition count."""
        count = len(topic_partitions(self.settings, self.settings.topic))
        configs = {self.topic: dict(COMPACTED)}
        ensure_topics(self.settings, [self.topic], partitions=count, configs=configs)
        have = len(topic_partitions(self.settings, self.topic))
        if have != count:
            raise ConfigError(
                f"{self.topic} has {have} partitions and {self.settings.topic} {count}: the "
                "recovery changelog is partitioned like the step log; use a new changelog topic"
            )

    def load(self, topic: str, partition: int) -> PartitionCheckpoint | None:
        """Read the partition's changelog to its end: its position and tracked steps."""
        position: int | None = None
        steps: dict[StepKey, list[str]] = {}
        starts = {(self.topic, partition): 0}
        group = self.settings.group(wire.RECOVERY_CHANGELOG_ROLE)
        try:
            for records in records_to_end(
                self.settings, starts, group=group, within=RESTORE_LIMIT_S
            ):
                for record in records:
                    if self.refusals.admit(self.topic, partition, record.headers):
                        position = self._apply(record.key, record.value, topic, steps, position)
        except StepLedgerError as exc:
            if isinstance(exc, RecoveryError):
                raise
            raise RecoveryError(f"cannot read the recovery state {self.topic}: {exc}") from None
        if position is None:
            return None
        return PartitionCheckpoint(position, steps)

    def _apply(
        self,
        raw_key: bytes | None,
        value: bytes | None,
        topic: str,
        steps: dict[StepKey, list[str]],
        position: int | None,
    ) -> int | None:
        try:
            key = json.loads(raw_key or b"null")
        except ValueError:
            return position
        if not isinstance(key, list) or len(key) < 2 or key[1] != self.group:
            return position  # another group's state, or not ours at all
        if key[0] == "position" and len(key) == 3 and key[2] == topic and value is not None:
            return int(value)
        if key[0] == "step" and len(key) == 5 and key[2] == topic:
            step: StepKey = (str(key[3]), str(key[4]))
            if value is None:
                steps.pop(step, None)
            else:
                steps[step] = value.decode().split("\n")
        return position

    def save(self, topic: str, batch: CheckpointBatch) -> None:
        """Write the steps' records, wait for them, then the positions."""
        if batch.empty():
            return
        with self._lock:
            pending: list[Future[Position]] = []
            for part, wf, step in batch.deletes:
                pending.append(self._send(part, _key("step", self.group, topic, wf, step), None))
            for (part, wf, step), events in batch.upserts.items():
                value = "\n".join(events).encode()
                pending.append(self._send(part, _key("step", self.group, topic, wf, step), value))
            self._wait(pending)
            positions = [
                self._send(part, _key("position", self.group, topic), str(offset).encode())
                for part, offset in batch.positions.items()
            ]
            self._wait(positions)

    def close(self) -> None:
        """Flush and close the producer."""
        self._producer.close()

    def _send(self, partition: int, key: bytes, value: bytes | None) -> Future[Position]:
        headers: Headers = [self.refusals.identity.header]
        return self._producer.send(self.topic, key, value, headers, partition=partition)

    def _wait(self, futures: list[Future[Position]]) -> None:
        try:
            for future in futures:
                self._producer.wait(future)
        except StepLedgerError as exc:
            raise RecoveryError(f"cannot write the recovery state to {self.topic}: {exc}") from None
