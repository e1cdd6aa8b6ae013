"""The broker side: topics, their partitions, and a broker awaited at start (bounded)."""

from __future__ import annotations

import logging
import math
import time

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from stepledger.config import Settings
from stepledger.errors import BrokerError, NotAuthorisedError
from stepledger.kafka.identity import refused_login, who
from stepledger.kafka.wireclient import login_refused


def admin(settings: Settings) -> AdminClient:
    """Return an admin client (no network until first used)."""
    try:
        return AdminClient(settings.client_config(**settings.quick_connect()))
    except KafkaException as exc:
        raise BrokerError(f"invalid Kafka settings: {exc}", retryable=False) from exc


def client_error(exc: BaseException) -> str | None:
    """The one line of a client exception (raised where settings made a client it refuses,
    e.g. a bad ``-X``), or None when ``exc`` is not the client's."""
    if not isinstance(exc, KafkaException):
        return None
    error = exc.args[0] if exc.args else None
    text = str(error.str() if isinstance(error, KafkaError) else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: What each refusal code means: the ACL the principal lacks (None: its credentials).
_REFUSALS = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "READ",
    # An idempotent producer with WRITE on no topic is refused its producer id (measured):
    # the ACL it lacks is WRITE on the topic it writes, not a cluster one.
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "WRITE",
    KafkaError._AUTHENTICATION: None,
    KafkaError.SASL_AUTHENTICATION_FAILED: None,
}


def refusal(
    err: KafkaError, settings: Settings, acl: str, resource: str
) -> NotAuthorisedError | None:
    """The one line of a refusal by the broker, or None when ``err`` is no refusal.

    ``acl`` and ``resource`` say what was asked (``WRITE``, ``TOPIC orders``); a group's
    refusal names READ on the group, a refused login the principal.  Every client error that
    may be a refusal passes here, so an operator reads one line naming what to grant.
    """
    code = err.code()
    if code not in _REFUSALS:
        return None
    lacks = _REFUSALS[code]
    if lacks is None:
        return refused_login(settings)
    role = who(settings)
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED and not resource.startswith("GROUP"):
        resource = "its GROUP"
    needed = lacks or acl
    return NotAuthorisedError(
        f"not authorised: {role} lacks {needed} on {resource}",
        role=role,
        acl=needed,
        resource=resource,
    )


#: How often a refusal a long read keeps meeting is said again (seconds).
REFUSAL_REPEAT_S = 300.0

logger = logging.getLogger(__name__)


class Refusals:
    """A reader's refusals by the broker: each one line naming the role, the ACL and the
    resource (:func:`refusal`); a long read says it once, then at most every
    ``REFUSAL_REPEAT_S``, and reads on (granting the ACL is enough).  ``asked`` names the
    resource where the error names no topic: the reader's group."""

    def __init__(self, settings: Settings, asked: str) -> None:
        self.settings, self.asked = settings, asked
        self._said: dict[str, float] = {}

    def of(self, err: KafkaError, topic: str | None) -> NotAuthorisedError | None:
        """The refusal ``err`` is, or None."""
        asked = self.asked
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and topic:
            asked = f"TOPIC {topic}"
        return refusal(err, self.settings, "READ", asked)

    def say(self, refused: NotAuthorisedError) -> None:
        now = time.monotonic()
        if now - self._said.get(refused.message, -math.inf) >= REFUSAL_REPEAT_S:
            self._said[refused.message] = now
            logger.error("%s (it keeps asking: granting it is enough)", refused.message)


def unreachable(settings: Settings, exc: BaseException | str) -> BrokerError:
    """The one line of a broker that did not answer: a refused login when it was one.

    librdkafka reports a wrong password only to an error callback and lets a request run
    into its timeout ("transport failure"); on an authenticated cluster one login attempt of
    our own tells a refused login (one line naming the principal) from a broker not reached.
    """
    if "sasl.username" in settings.kafka and login_refused(settings):
        return refused_login(settings)
    detail = client_error(exc) if isinstance(exc, BaseException) else exc
    return BrokerError(f"cannot reach Kafka at {settings.bootstrap}: {detail or exc}")


def check_login(settings: Settings) -> None:
    """Raise the one line of a refused login now, when these settings authenticate and the
    broker refuses them (an unreachable broker is left to the request that follows)."""
    if "sasl.username" in settings.kafka and login_refused(settings):
        raise refused_login(settings)


def reachable_partitions(settings: Settings, topic: str) -> list[int]:
    """:func:`topic_partitions`, waiting up to ``settings.startup_wait_s`` for the broker.

    A daemon started while its broker is still coming up (a pod before Kafka, a supervisor
    restarting both) waits, bounded, instead of exiting; a missing topic fails at once.
    """
    deadline = time.monotonic() + settings.startup_wait_s
    while True:
        try:
            return topic_partitions(settings, topic)
        except BrokerError as exc:
            if not exc.retryable or time.monotonic() >= deadline:
                raise
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


def topic_partitions(settings: Settings, topic: str, timeout: float = 5.0) -> list[int]:
    """Return the partitions of a topic; raise BrokerError if unreachable or unknown."""
    found = listed_topics(settings, timeout).get(topic)
    if not found:
        raise _unlisted(settings, topic)
    return found


def listed_topics(settings: Settings, timeout: float = 5.0) -> dict[str, list[int]]:
    """Every topic the broker lists, with its partitions; BrokerError if unreachable."""
    return _listed(admin(settings), settings, timeout)


def _listed(client: AdminClient, settings: Settings, timeout: float) -> dict[str, list[int]]:
    try:
        # A metadata request naming the topic would auto-create it on some brokers (Tansu
        # does): list every topic instead, so an unknown topic is reported, not created.
        meta = client.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise unreachable(settings, exc) from None
    return {
        name: sorted(info.partitions)
        for name, info in meta.topics.items()
        if info.error is None and info.partitions
    }


def _unlisted(settings: Settings, topic: str) -> BrokerError:
    """A topic the broker does not list: missing, or (authenticated) not described to us.

    A principal without DESCRIBE on a topic is not told it exists (measured): on a cluster
    with credentials the line says both, so no one creates a topic that is there.
    """
    where = settings.bootstrap
    if "sasl.username" not in settings.kafka:
        return BrokerError(f"topic {topic!r} does not exist on {where}", retryable=False)
    return NotAuthorisedError(
        f"not authorised: {who(settings)} lacks DESCRIBE on TOPIC {topic} "
        f"(or it does not exist on {where})",
        role=who(settings),
        acl="DESCRIBE",
        resource=f"TOPIC {topic}",
    )


#: What a broker without topic ids (before KIP-516) answers: the all-zero UUID.
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


def topic_id(settings: Settings, topic: str, timeout: float = 5.0) -> str:
    """The id the broker gave the topic when it was created (KIP-516, base64 as Kafka's tools
    print it); BrokerError when the topic is missing or the broker gives none.

    Apache Kafka gives every topic a random UUID; Tansu gives one too (checked: a topic
    deleted and created again gets another on both).
    """
    client = admin(settings)
    # Listed first: a request naming a missing topic would create it on Tansu.
    if topic not in _listed(client, settings, timeout):
        raise _unlisted(settings, topic)
    try:
        futures = client.describe_topics(TopicCollection([topic]), request_timeout=timeout)
        found = str(futures[topic].result(timeout).topic_id)
    except KafkaException as exc:
        raise BrokerError(f"cannot describe topic {topic!r}: {exc}") from None
    if not found or found == _NO_TOPIC_ID:
        raise BrokerError(
            f"the broker at {settings.bootstrap} gives {topic!r} no topic id (KIP-516, "
            "Kafka 2.8+): the step log's identity cannot be read",
            retryable=False,
        )
    return found


def ensure_topics(
    settings: Settings,
    topics: list[str],
    partitions: int = 3,
    timeout: float = 10.0,
    configs: dict[str, dict[str, str]] | None = None,
) -> None:
    """Create the topics that do not exist yet (idempotent), replicated as the cluster's
    ``default.replication.factor`` says (a fixed factor of 1 would leave the log on one
    broker of a cluster, where ``acks=all`` means only that broker).

    ``configs`` gives a created topic its settings (see :mod:`stepledger.kafka.topics`); an
    existing topic keeps its own."""
    client = admin(settings)
    try:
        existing = set(client.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise unreachable(settings, exc) from None
    given = configs or {}
    missing = [
        NewTopic(t, partitions, config=given.get(t, {})) for t in topics if t not in existing
    ]
    if not missing:
        return
    for topic, future in client.create_topics(missing, operation_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            # Refused: a topic this principal may not describe looked missing to it.
            resource = f"TOPIC {topic} (or DESCRIBE, if it exists)"
            refused = refusal(exc.args[0], settings, "CREATE", resource)
            if refused is not None:
                raise refused from None
            raise BrokerError(f"cannot create topic {topic!r}: {exc}") from None
    # A create is acknowledged once the controller committed it; a broker learns of the
    # topic after (under load, Apache Kafka still answered "unknown topic" right after), and
    # a daemon started at once would take it for missing: wait, bounded, until it is listed.
    created = {t.topic for t in missing}
    deadline = time.monotonic() + timeout
    while True:
        listed = _listed(client, settings, max(0.1, deadline - time.monotonic()))
        waiting = sorted(created - listed.keys())
        if not waiting:
            return
        if time.monotonic() >= deadline:
            raise BrokerError(f"created topics {waiting} are not listed by the broker yet")
        time.sleep(0.05)
