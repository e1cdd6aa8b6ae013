"""After librdkafka declares a producer dead, the next record gets a new one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from stepledger.config import Settings
from stepledger.errors import DurabilityError
from stepledger.kafka import DurableProducer


class FakeMessage:
    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


#: What confluent-kafka's ``produce`` raises once librdkafka declared the client dead
#: (measured on Apache Kafka 4.x with confluent-kafka 2.16: ``fatal()`` is false).
REFUSED = KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error")


class FakeProducer:
    """Acknowledges every record, or refuses each one once ``dead``; ``die`` makes the next
    ``poll`` raise the fatal error, as confluent-kafka does (never through ``error_cb``)."""

    def __init__(self, conf: dict[str, Any], *, dead: bool) -> None:
        self.conf, self.dead = conf, dead
        self.pending: list[Callable[[KafkaError | None, Any], None]] = []
        self.purged: list[Callable[[KafkaError | None, Any], None]] = []
        self.before_produce: Callable[[], None] | None = None
        self.fatal: KafkaError | None = None

    def die(self, reason: str = "unable to satisfy gap-less guarantee") -> None:
        """The client dies; its records stay unreported until purged."""
        self.dead = True
        self.fatal = KafkaError(KafkaError._GAPLESS_GUARANTEE, reason, fatal=True)

    def produce(self, topic: str, value: Any, key: Any, **kw: Any) -> None:
        if self.before_produce is not None:
            self.before_produce()
        if self.dead:
            raise KafkaException(REFUSED)
        self.pending.append(kw["on_delivery"])

    def poll(self, timeout: float = 0) -> int:
        # One report at a time, as librdkafka: a callback that raises stops the poll, and
        # the reports after it wait for the next one.
        if self.fatal is not None:
            fatal, self.fatal = self.fatal, None
            raise KafkaException(fatal)
        if self.dead and self.pending:  # a dead client reports nothing of its own
            time.sleep(min(timeout, 0.01))
            return 0
        served = 0
        while self.pending:
            served += 1
            self.pending.pop(0)(None, FakeMessage())
        while self.purged:
            served += 1
            self.purged.pop(0)(KafkaError(KafkaError._PURGE_QUEUE, "purged"), FakeMessage())
        if not served and timeout:
            time.sleep(min(timeout, 0.01))
        return served

    def purge(self, **kw: Any) -> None:
        """As librdkafka: each record held fails with "purged", reported by a later poll."""
        self.purged += self.pending
        self.pending = []

    def __len__(self) -> int:
        return len(self.pending) + len(self.purged)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return len(self)


def made_clients(
    monkeypatch: pytest.MonkeyPatch,
    build: Callable[[dict[str, Any], list[Any]], Any] = lambda conf, made: FakeProducer(
        conf, dead=False
    ),
) -> list[Any]:
    """Every client the producer makes from now on, each built by ``build(conf, made)``."""
    made: list[Any] = []

    def new_producer(conf: dict[str, Any]) -> Any:
        made.append(build(conf, made))
        return made[-1]

    monkeypatch.setattr("stepledger.kafka.producer._new_producer", new_producer)
    return made


def test_a_fatal_error_fails_that_record_and_the_next_one_gets_a_new_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = made_clients(monkeypatch, lambda conf, made: FakeProducer(conf, dead=not made))
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    with pytest.raises(DurabilityError, match="Fatal error"):
        producer.append("t", b"k", b"v")
    assert producer.append("t", b"k", b"v").offset == 7
    assert producer.append("t", b"k", b"v").offset == 7
    assert len(made) == 2
    producer.close()


@pytest.mark.parametrize("served_by", ["the waiting thread", "the delivery thread"])
def test_a_fatal_error_raised_by_poll_fails_the_held_records_at_once_and_replaces_the_client(
    monkeypatch: pytest.MonkeyPatch, served_by: str
) -> None:
    """confluent-kafka raises a fatal error from ``poll`` and never calls ``error_cb`` with
    it: the client was never replaced, and every later record was refused for good."""
    made = made_clients(monkeypatch)
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    producer.append("t", b"k", b"v")
    if served_by == "the delivery thread":
        producer._start_background_poller()
    held = producer.queue("t", b"k", b"v")
    made[0].die()
    started = time.monotonic()
    with pytest.raises(DurabilityError, match="purged"):
        held()
    assert time.monotonic() - started < 1.0  # its purge report, not the 3 s limit
    assert producer.append("t", b"k", b"v").offset == 7
    assert len(made) == 2
    producer.close()


def test_a_client_dying_while_closing_leaves_one_line_not_a_kafka_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = made_clients(monkeypatch)
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    held = producer.queue("t", b"k", b"v")
    made[0].die()
    producer.close()  # flush met the fatal error: the held record failed, nothing is left
    with pytest.raises(DurabilityError, match="purged"):
        held()


def test_a_record_produced_into_a_client_just_replaced_is_still_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread took the client, another replaced it before the first one's produce: the
    record lands in the old client, which must still be served (and purged: the key's
    next record goes to the new client), not dropped with the record never reported."""
    made = made_clients(monkeypatch)
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    producer.append("t", b"k", b"v")
    prompt = made[0]

    def replaced_meanwhile() -> None:
        prompt.before_produce = None
        producer._note(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        producer._client()  # what the other thread's record did

    prompt.before_produce = replaced_meanwhile
    started = time.monotonic()
    with pytest.raises(DurabilityError, match="purged"):
        producer.append("t", b"k", b"v")
    assert time.monotonic() - started < 1.0  # its report, not the wait's time limit (3 s)
    assert producer.append("t", b"k", b"v").offset == 7
    producer.close()


class TimingOut(FakeProducer):
    """Holds its records; once ``expire`` is set, reports each as timed out."""

    expire = False

    def poll(self, timeout: float = 0) -> int:
        if not self.expire:
            time.sleep(min(timeout, 0.01))
            return 0
        expired, self.pending = self.pending, []
        for callback in expired:
            callback(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), FakeMessage())
        return len(expired)

    def purge(self, **kw: Any) -> None:
        pass  # a record purge misses: it times out later


def test_a_replaced_clients_late_timeouts_do_not_condemn_its_successor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replaced client is still served (its records must be reported), but its reports
    say nothing of the new client: two late timeouts of its own replaced a healthy one."""
    made = made_clients(
        monkeypatch,
        lambda conf, made: (
            TimingOut(conf, dead=False) if not made else FakeProducer(conf, dead=False)
        ),
    )
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    waits = [producer.queue("t", b"k%d" % n, b"v") for n in range(2)]
    producer._note(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    assert producer.append("t", b"k", b"v").offset == 7  # on a new client
    old = made[0]
    assert isinstance(old, TimingOut)
    old.expire = True
    for wait in waits:
        with pytest.raises(DurabilityError, match="timed out"):
            wait()
    assert producer.append("t", b"k", b"v").offset == 7
    assert len(made) == 2, "the healthy client was replaced for the old one's timeouts"
    producer.close()


def test_a_report_callback_that_raises_does_not_stop_the_delivery_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A settle that raises (a ``send`` future cancelled as its report is set) once killed
    the delivery thread for good: every later ``queue`` wait ran to its time limit."""
    made_clients(monkeypatch)
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    first = producer.queue("t", b"k", b"v")
    assert first().offset == 7  # the delivery thread runs

    def boom(outcome: object) -> None:
        raise RuntimeError("a callback that raises")

    producer._produce("t", b"k", b"v", None, boom)
    started = time.monotonic()
    assert producer.queue("t", b"k", b"v")().offset == 7
    assert time.monotonic() - started < 0.5  # served, not the 3 s limit
    future = producer.send("t", b"k", b"v")
    assert future.cancel() or future.done()  # cancelled before its report: set quietly
    producer.close()


def test_a_replaced_client_leaves_the_delivery_thread_waiting_not_spinning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Until a record makes the next client there is nothing to poll: each turn of the
    delivery thread waits as a poll would (it spun at 100% CPU for the idle agent's life)."""
    made = made_clients(monkeypatch)
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    turns = [0]
    serve = producer._poll_once

    def counted(timeout: float, waiting: Any = None) -> None:
        turns[0] += 1
        serve(timeout, waiting)

    monkeypatch.setattr(producer, "_poll_once", counted)
    held = producer.queue("t", b"k", b"v")  # the delivery thread serves it
    made[0].die()
    with pytest.raises(DurabilityError, match="purged"):
        held()
    assert producer._producer is None  # replaced; no record since
    turns[0] = 0
    began = time.monotonic()
    time.sleep(0.3)  # the idle time being measured, not a wait for a condition
    rate = turns[0] / (time.monotonic() - began)
    # ~100 turns/s for a thread waiting its 10 ms at a time; a spinning one makes ~10^5.
    assert rate < 300, f"{turns[0]} turns in 0.3 s: the delivery thread spins"
    producer.close()


def test_a_dead_clients_refusal_does_not_condemn_its_healthy_successor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread took the client; it died and was replaced before the thread's produce, which
    the dead client refused: the new client, holding another thread's record, stays."""
    made = made_clients(monkeypatch)
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    producer.append("t", b"k", b"v")
    first = made[0]

    def died_and_replaced_meanwhile() -> None:
        first.before_produce = None
        first.dead = True
        producer._note(KafkaError(KafkaError._GAPLESS_GUARANTEE, "gap", fatal=True))
        producer._client()
        assert len(made) == 2

    first.before_produce = died_and_replaced_meanwhile
    with pytest.raises(DurabilityError, match="Fatal error"):
        producer.append("t", b"k", b"v")
    assert producer._fatal is None
    assert producer.append("t", b"k", b"v").offset == 7
    assert len(made) == 2, "the healthy successor was replaced for its predecessor's refusal"
    producer.close()


class FullThenDead(FakeProducer):
    """Its local queue is full; the poll that should drain it raises the fatal error."""

    def produce(self, topic: str, value: Any, key: Any, **kw: Any) -> None:
        if self.dead:
            raise KafkaException(REFUSED)
        self.die()
        raise BufferError("queue full")


def test_a_fatal_error_raised_while_the_local_queue_is_full_is_one_durability_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = made_clients(
        monkeypatch,
        lambda conf, made: (
            FullThenDead(conf, dead=False) if not made else FakeProducer(conf, dead=False)
        ),
    )
    producer = DurableProducer(Settings(durable_timeout_s=1.0))
    with pytest.raises(DurabilityError, match="gap-less"):
        producer.append("t", b"k", b"v")
    assert producer.append("t", b"k", b"v").offset == 7  # on a new client
    assert len(made) == 2
    producer.close()
