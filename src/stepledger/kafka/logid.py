"""The identity of a step log, and how every state record names it (invariant 21).

A topic's name does not identify a step log: a topic deleted and created again keeps its
name, another cluster has a topic of the same name, and up to 0.3.0 every step log of a
cluster shared one checkpoint topic by default.  A step log's identity is its name and the
topic id the broker gave it when ``stepledger init`` created it (KIP-516): nobody chooses
it, a topic created again gets another, and so does another cluster's topic.  Both brokers
give one (Apache Kafka a random UUID, Tansu a time-ordered one).  The alternatives were
checked and dropped: Apache Kafka refuses a topic config it does not know (``Unknown topic
config name``), and a first record on the step log would be deleted by the very retention
the state topics outlive.

Every record written to a state topic (checkpoints, progress, directory roots and chunks,
the recovery changelog) names its step log in the ``stepledger_log`` header,
``<topic>@<topic id>``.  Every reader of a state topic compares it with its own step log's
and refuses a record that names another log, or none (written before 0.4.0, or by
something that is not stepledger): the record is counted and one line per state topic and
name is logged, never an error (``stepledger init --adopt-unnamed-state`` names the records
of a deployment upgraded from 0.3.0).

The identity tells logs apart; it does not authenticate a writer: anyone who may describe
the step log can read it (docs/guarantees.md, "Two deployments on one cluster").
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from stepledger import wire
from stepledger.config import Settings
from stepledger.kafka import Headers, topic_id

logger = logging.getLogger(__name__)

#: Record headers as confluent-kafka hands them over (or as a producer takes them).
HeaderPairs = Mapping[str, str | bytes | None] | Iterable[tuple[str, str | bytes | None]] | None


class Origin(Enum):
    """Whose a state record is, as its ``stepledger_log`` header says."""

    OWN = "own"
    """It names this step log."""
    FOREIGN = "foreign"
    """It names another step log (another deployment, or this name before a re-creation)."""
    UNNAMED = "unnamed"
    """It names none: written before 0.4.0, or not by stepledger."""


@dataclass(frozen=True)
class LogIdentity:
    """One step log: its topic and the id the broker gave that topic."""

    topic: str
    topic_id: str

    def __str__(self) -> str:
        # '@' is not allowed in a topic name: the two parts never run together.
        return f"{self.topic}@{self.topic_id}"

    @property
    def header(self) -> tuple[str, bytes]:
        """The header every state record of this log carries."""
        return (wire.LOG_IDENTITY_HEADER, str(self).encode())

    def origin(self, headers: HeaderPairs) -> Origin:
        """Whose a record with these headers is."""
        named = named_in(headers)
        if named is None:
            return Origin.UNNAMED
        return Origin.OWN if named == str(self) else Origin.FOREIGN


def named_in(headers: HeaderPairs) -> str | None:
    """The step log a record's ``stepledger_log`` header names (None: none)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == wire.LOG_IDENTITY_HEADER and value:
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            return text
    return None


def stamped(identity: LogIdentity, headers: HeaderPairs = None) -> Headers:
    """``headers`` with the identity's header (any other ``stepledger_log`` dropped)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    kept: Headers = [
        (name, value.encode() if isinstance(value, str) else value)
        for name, value in pairs
        if name != wire.LOG_IDENTITY_HEADER
    ]
    return [*kept, identity.header]


class Refusals:
    """The state records one reader refused: counted, one log line per topic and name."""

    def __init__(self, identity: LogIdentity, reader: str) -> None:
        self.identity = identity
        self.reader = reader
        self.counts: Counter[tuple[str, str]] = Counter()
        """(state topic, the log named or ``-`` for none) -> records refused."""
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        """Records refused so far."""
        return sum(self.counts.values())

    def admit(self, topic: str, partition: int, headers: HeaderPairs) -> bool:
        """True for a record of this step log; otherwise count it (and say so once)."""
        if self.identity.origin(headers) is Origin.OWN:
            return True
        named = named_in(headers)
        if named is None:
            why = "names no step log (written before 0.4.0, or not by stepledger)"
        else:
            why = f"names another step log ({named}): a state topic two deployments share?"
        self.refuse(topic, partition, named or "-", why)
        return False

    def refuse(self, topic: str, partition: int, named: str, why: str) -> None:
        """Count a refused record under ``named`` and log ``why`` the first time."""
        with self._lock:
            first = (topic, named) not in self.counts
            self.counts[(topic, named)] += 1
        if first:
            logger.warning(
                "%s: a record of %s[%d] %s; refused: only records naming %s that it does "
                "not contradict are read (`stepledger doctor`)",
                self.reader,
                topic,
                partition,
                why,
                self.identity,
                extra={"topic": topic, "partition": partition, "named": named},
            )


_resolved: dict[tuple[str, str], LogIdentity] = {}
_resolved_lock = threading.Lock()


def resolve(settings: Settings) -> LogIdentity:
    """The settings' step log's identity, asked of the broker once per process and log.

    BrokerError when the step log does not exist (``stepledger init``) or has no topic id.
    """
    where = (settings.bootstrap, settings.topic)
    with _resolved_lock:
        known = _resolved.get(where)
    if known is not None:
        return known
    identity = LogIdentity(settings.topic, topic_id(settings, settings.topic))
    with _resolved_lock:
        return _resolved.setdefault(where, identity)
