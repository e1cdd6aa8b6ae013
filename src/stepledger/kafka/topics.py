"""Topic settings in one place: what ``init`` creates, and what every reader checks at start.

The step log is the state (invariant 16): the broker may delete nothing that is the only copy
of it.  So the step log is created with ``retention.ms=-1`` unless an operator asks for a
finite retention, which is accepted only together with the compacted checkpoint topic
(:mod:`stepledger.checkpoints`) that covers what retention deletes.

Every process that reads the log (the SDK, the projector, the recovery daemon, the inbox,
the CLI) calls :func:`check_retention` once at start: one warning line when the broker may
delete history that no checkpoint covers.  Tansu enforces no retention and answers no
``DescribeConfigs`` the way Apache Kafka does; the check then says nothing.

A topic may take smaller records than the producer's ``message.max.bytes``: its own
``max.message.bytes`` (:func:`topic_max_message_bytes`, read once per process and topic) is
the limit every writer fits its records to.  A principal without ``DESCRIBE_CONFIGS`` on the
topic (or a broker that does not answer) gets one log line and the producer's limit alone.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from stepledger import wire
from stepledger.config import Settings
from stepledger.errors import BrokerError, ConfigError
from stepledger.kafka.broker import ensure_topics, topic_partitions
from stepledger.kafka.describe import ClusterView

logger = logging.getLogger(__name__)

#: Keep every record: the step log is the state.
INFINITE = -1
#: A compacted topic keeps the newest record of every key for good.
COMPACTED = {"cleanup.policy": "compact"}
_DESCRIBE_TIMEOUT_S = 5.0


def step_log_config(retention_ms: int = INFINITE, *, checkpoints: bool = False) -> dict[str, str]:
    """The topic settings ``init`` gives the step log (the one place they are decided).

    A finite ``retention_ms`` without checkpoints is refused: history the broker deletes
    would be gone with nothing to resume a waiting workflow from.
    """
    if retention_ms != INFINITE and retention_ms <= 0:
        raise ConfigError(f"retention {retention_ms} ms: give -1 (keep everything) or a positive")
    if retention_ms != INFINITE and not checkpoints:
        raise ConfigError(
            f"a finite retention ({retention_ms} ms) needs checkpoints (--checkpoints): "
            "without them the broker deletes the only copy of waiting workflows' state"
        )
    # Broker time on every record: the recovery daemon anchors deadlines on it, so no two
    # machines' wall clocks are ever compared (one clock for deadlines, invariant 15).
    return {
        "retention.ms": str(retention_ms),
        "cleanup.policy": "delete",
        "message.timestamp.type": wire.STEP_LOG_TIMESTAMP_TYPE,
    }


def ensure_budget_topic(settings: Settings, topic: str) -> int:
    """Create the budget topic if missing (one partition, keep everything); its partitions.

    One partition gives every fleet's spends one order (a fleet's records are keyed by the
    fleet, so even a topic made with more keeps each fleet in one); keeping everything keeps
    every reservation a later reader must fold.
    """
    config = {"retention.ms": str(INFINITE), "cleanup.policy": "delete"}
    ensure_topics(settings, [topic], partitions=1, configs={topic: config})
    return len(topic_partitions(settings, topic))


def checkpoint_topic_config() -> dict[str, str]:
    """The checkpoint topic's settings: compacted, so each workflow's newest checkpoint stays."""
    return dict(COMPACTED)


@dataclass(frozen=True)
class Retention:
    """What the broker may delete from a topic, as its configuration says."""

    topic: str
    retention_ms: int | None
    """``retention.ms`` (-1: forever; None: the broker did not say)."""
    cleanup_policy: str | None
    """``cleanup.policy`` (``delete``, ``compact`` or both; None: the broker did not say)."""

    @property
    def deletes(self) -> bool:
        """True when the broker deletes records by age (not kept forever, not compact-only)."""
        policy = self.cleanup_policy or "delete"
        if "delete" not in policy:
            return False
        return self.retention_ms is not None and self.retention_ms != INFINITE


def describe_retention(settings: Settings, topic: str) -> Retention:
    """Read a topic's ``retention.ms`` and ``cleanup.policy`` (None where the broker is silent)."""
    values = _describe(settings, topic, ("retention.ms", "cleanup.policy"))
    raw = values.get("retention.ms")
    retention = int(raw) if raw is not None and raw.lstrip("-").isdigit() else None
    return Retention(topic, retention, values.get("cleanup.policy"))


def topic_exists(settings: Settings, topic: str) -> bool:
    """True when the broker lists the topic (no auto-creation: every topic is listed)."""
    try:
        listed = ClusterView(settings).layout(timeout=_DESCRIBE_TIMEOUT_S).names
    except BrokerError:
        return False
    return topic in listed


_checked: set[tuple[str, str]] = set()
_checked_lock = threading.Lock()
_max_bytes: dict[tuple[str, str], int | None] = {}
_max_bytes_lock = threading.Lock()


def topic_max_message_bytes(settings: Settings, topic: str) -> int | None:
    """The topic's ``max.message.bytes``, read once per process; None when it cannot be read.

    A refused or failed read (no ``DESCRIBE_CONFIGS`` on the topic, no answer) logs one line
    and is not tried again by this process: the writer goes by the producer's limit, and a
    record the broker then refuses as too large is counted and escalated where it matters
    (the recovery daemon's decisions), never retried forever.
    """
    where = (settings.bootstrap, topic)
    with _max_bytes_lock:
        if where in _max_bytes:
            return _max_bytes[where]
        try:
            raw = _describe(settings, topic, ("max.message.bytes",)).get("max.message.bytes")
        except Exception as exc:  # a check must never stop the process: the producer's limit
            logger.warning(
                "could not read max.message.bytes of %s (%s: %s): records are fitted to the "
                "producer's message.max.bytes only; grant DESCRIBE_CONFIGS on the topic",
                topic,
                type(exc).__name__,
                str(exc)[:300],
            )
            raw = None
        found = int(raw) if raw is not None and raw.isdigit() and int(raw) > 0 else None
        _max_bytes[where] = found
        return found


def check_retention(settings: Settings, role: str) -> Notice | None:
    """Once per process and topic: log one warning line when the step log's state can expire.

    Finite retention with the checkpoint topic present is an info line (checkpoints cover
    what is deleted, as long as a checkpointer runs); finite retention without it is the
    warning.  Returns what was logged (None: nothing, or already checked in this process).
    """
    where = (settings.bootstrap, settings.topic)
    with _checked_lock:
        if where in _checked:
            return None
        _checked.add(where)
    notice = retention_notice(settings, role)
    if notice is not None:
        logger.log(notice.level, "%s", notice.message)
    return notice


@dataclass(frozen=True)
class Notice:
    """One line about the step log's retention, and how loud it is."""

    level: int
    message: str


def retention_notice(settings: Settings, role: str) -> Notice | None:
    """What to say about the step log's retention (None: nothing can expire, or no answer)."""
    try:
        found = describe_retention(settings, settings.topic)
    except Exception as exc:  # a check at start must never stop the process
        logger.info("%s: could not read %s's retention: %s", role, settings.topic, exc)
        return None
    if not found.deletes:
        return None
    days = f"{(found.retention_ms or 0) / 86_400_000:.3g}"
    if topic_exists(settings, settings.checkpoint_topic):
        return Notice(
            logging.INFO,
            f"{role}: {settings.topic} deletes records after {days} days "
            f"(retention.ms={found.retention_ms}); older history is read from the checkpoints "
            f"on {settings.checkpoint_topic}, which a checkpointer must keep writing",
        )
    return Notice(
        logging.WARNING,
        f"{role}: {settings.topic} deletes records after {days} days "
        f"(retention.ms={found.retention_ms}, cleanup.policy={found.cleanup_policy}) and "
        f"{settings.checkpoint_topic} does not exist: a workflow waiting longer loses its "
        "state; set retention.ms=-1 or run `stepledger init --checkpoints` and a checkpointer",
    )


def _describe(settings: Settings, topic: str, names: tuple[str, ...]) -> dict[str, str | None]:
    configs = ClusterView(settings).topic_configs(topic, timeout=_DESCRIBE_TIMEOUT_S)
    return {name: configs.get(name) for name in names}
