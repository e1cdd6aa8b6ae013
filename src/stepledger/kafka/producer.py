"""The durable producer: lazy client, typed errors, per-record delivery waits.

No network happens in ``__init__``.  Every produced record gets its own future resolved
by its delivery report, so concurrent callers never wait on each other's records (and
never on a global ``flush()``).

Who serves delivery reports: a thread that waits synchronously polls the producer itself
(one poller at a time, under a lock), so its own report wakes it without a hand-off to
another thread; the reports it serves for other threads resolve their futures on the way.
A background thread, started only when the asyncio API is first used, serves coroutines.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from stepledger.config import Settings
from stepledger.errors import (
    BrokerError,
    ConfigError,
    DurabilityError,
    RecordRefusedError,
    RecordTooLargeError,
)
from stepledger.kafka.broker import refusal
from stepledger.kafka.release import drop_within

#: Record headers; a header may carry no value (None), which stays None end to end.
Headers = list[tuple[str, bytes | None]]

logger = logging.getLogger(__name__)
#: Consecutive records timed out before the client is taken for stuck and replaced.
_STUCK_AFTER_TIMEOUTS = 2

#: Durability first: every record is acknowledged by all in-sync replicas, never duplicated
#: by an internal retry, and never held back by a linger meant for throughput.
DURABLE_PRODUCER = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 0,
    "max.in.flight.requests.per.connection": 5,
}

#: The durable settings a user's librdkafka setting may not weaken, and the values each
#: may take: anything else is refused in one line rather than silently overridden.
_IN_FLIGHT = ("1", "2", "3", "4", "5")
_GUARDED: dict[str, tuple[tuple[str, ...], str]] = {
    "acks": (("all", "-1"), "acks=all"),
    "request.required.acks": (("all", "-1"), "acks=all"),
    "enable.idempotence": (("true",), "enable.idempotence=true"),
    "max.in.flight.requests.per.connection": (_IN_FLIGHT, "at most 5 requests in flight"),
    "max.in.flight": (_IN_FLIGHT, "at most 5 requests in flight"),
}
#: Set through ``Settings.durable_timeout_s``, which the SDK's waits are bounded by.
_TIMEOUT_KEYS = ("message.timeout.ms", "delivery.timeout.ms")


def durable_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """The durable producer's librdkafka config: the user's settings win where they are safe.

    A setting the user gave (``-X``, ``STEPLEDGER_KAFKA_*``, ``[kafka]``) is honoured
    (``linger.ms=5`` makes each durable write wait up to 5 ms for company), over the SDK's
    defaults and a caller's ``overrides``; one that would weaken a durable write
    (``acks``, idempotence, more than 5 requests in flight, a delivery timeout other than
    ``durable_timeout_s``) raises ConfigError.
    """
    user = {key: str(value) for key, value in settings.kafka.items()}
    for key, value in user.items():
        allowed, needs = _GUARDED.get(key, ((value.strip().lower(),), ""))
        if value.strip().lower() not in allowed:
            raise ConfigError(
                f"-X {key}={value} is refused: the step log's durable producer needs {needs}"
            )
        if key in _TIMEOUT_KEYS:
            raise ConfigError(
                f"-X {key}={value} is refused: set durable_timeout_s "
                "(STEPLEDGER_DURABLE_TIMEOUT_S) instead"
            )
    timeout_ms = int(settings.durable_timeout_s * 1000)
    return settings.client_config(
        **{**DURABLE_PRODUCER, "message.timeout.ms": timeout_ms, **overrides, **user}
    )


@dataclass(frozen=True)
class Position:
    """Where an acknowledged record landed."""

    topic: str
    partition: int
    offset: int


class DurableProducer:
    """Produce records and wait for each one's own acknowledgement (sync or asyncio)."""

    def __init__(self, settings: Settings, **overrides: Any) -> None:
        self._settings = settings
        self._overrides = overrides
        durable_config(settings, **overrides)  # refuse unsafe settings now, not at first write
        self._producer: Producer | None = None
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None
        self._handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopHandoff] = (
            weakref.WeakKeyDictionary()
        )
        self._last_handoff: weakref.ref[_LoopHandoff] | None = None
        """The handoff of the loop that sent last: a weak-map lookup per record costs more."""
        self._fatal: KafkaError | None = None
        self._refused: tuple[KafkaError, float] | None = None
        """The broker's last refusal of this principal (an ACL, its login) and when: records
        fail with its one line, and a new client is tried at most every REFUSAL_RETRY_S."""
        self._timeouts = 0
        self._retired: list[Producer] = []
        """Clients replaced after a fatal error, served until every record they held is
        reported (their purge's reports come after it returns)."""

    def _client(self) -> Producer:
        if self._fatal is not None:
            self._replace_after_fatal()
        refused = self._refused
        if self._producer is None and refused is not None:
            if time.monotonic() - refused[1] < REFUSAL_RETRY_S:
                # Not a new client per record: the broker said no a moment ago.
                raise self._refusal_of(refused[0], None)
            self._refused = None
        if self._producer is None:
            with self._lock:
                if self._producer is None:
                    conf = durable_config(
                        self._settings, **{"error_cb": self._on_error, **self._overrides}
                    )
                    self._producer = _new_producer(conf)
        return self._producer

    def _replace_after_fatal(self) -> None:
        """Drop a client librdkafka declared dead (fenced, fatal idempotence error).

        Such a client refuses every later record, so the next record gets a new one (a new
        producer id); records the old one still held fail through their own reports.
        """
        with self._lock, self._poll_lock:
            if self._fatal is None:
                return
            old, self._producer, fatal = self._producer, None, self._fatal
            self._fatal = None
            if old is not None:
                self._retired.append(old)
        if old is not None:
            # Its records fail with "purged", but the reports come later (measured: often
            # none yet by the next poll): every poll serves it until it holds nothing, or
            # their waits would run to the time limit.
            with contextlib.suppress(KafkaException):
                old.purge()
        if self._refused is not None:
            logger.error("%s", self._refusal_of(fatal, None).message)
        else:
            logger.warning("replaced the Kafka producer after a fatal error: %s", fatal.str())

    def _refusal_of(self, err: KafkaError, topic: str | None) -> RecordRefusedError:
        """The one line of the broker's refusal of a record (``err`` a refusal code)."""
        resource = f"TOPIC {topic}" if topic else "the topic it writes"
        found = refusal(err, self._settings, "WRITE", resource)
        assert found is not None, "called with a refusal"
        return RecordRefusedError(
            found.message, role=found.role, acl=found.acl, resource=found.resource
        )

    def _note(self, err: KafkaError) -> None:
        # Besides fatal errors: a client whose records keep timing out can be stuck for good
        # (measured: after the dev broker restarted empty, librdkafka bumped its idempotent
        # epoch forever on "unknown producer id"); a new client starts clean.
        if err.code() == KafkaError._MSG_TIMED_OUT:
            self._timeouts += 1
        if _is_login_or_cluster_refusal(err):
            # Fatal (a cluster refusal) or not (a refused login, retried forever while the
            # records wait out message.timeout.ms): either way this client writes nothing.
            if self._refused is None:
                self._refused = (err, time.monotonic())
                self._fatal = err
        elif _dead(err) or self._timeouts >= _STUCK_AFTER_TIMEOUTS:
            self._fatal, self._timeouts = err, 0

    def connect(self) -> None:
        """Create the client now and return at once: its connection and idempotent producer
        id get ready in the background (librdkafka's first producer-id request waits for a
        broker), so a first durable write made later waits less."""
        self._client()

    def _start_background_poller(self) -> None:
        if self._poller is not None:  # every asyncio record asks: no lock once it runs
            return
        with self._lock:
            if self._poller is None:
                self._poller = threading.Thread(
                    target=self._poll_loop, name="stepledger-delivery", daemon=True
                )
                self._poller.start()

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            try:
                self._poll_once(0.01)
            except Exception:
                # A report's callback raised (poll stops there and raises it): the thread
                # serves on, or every later wait of this producer would run to its limit.
                logger.exception("a delivery report's callback raised; serving the next ones")

    def _poll_once(self, timeout: float, waiting: _Waiting | None = None) -> None:
        # librdkafka's poll returns as soon as it served a report, so holding the lock
        # for one poll costs other waiters at most the time to the next report.
        with self._poll_lock:
            if self._retired:
                self._serve_retired()
            served = waiting is not None and waiting.done()
            # None: replaced, and no record made a new client yet.
            idle = self._producer is None and not served
            if self._producer is not None and not served:
                self._poll_client(self._producer, timeout)
        if self._fatal is not None:
            # Now, not at the next record: the dead client's records fail through their
            # purge reports instead of waiting out their time limit.
            self._replace_after_fatal()
        elif idle:
            self._closed.wait(timeout)  # nothing to poll: wait as a poll would, not spin

    def _poll_client(self, producer: Producer, timeout: float) -> None:
        """Poll one client; a fatal error it raises condemns it if it is still the current one."""
        try:
            producer.poll(timeout)
        except KafkaException as exc:
            if not _is_fatal(exc):
                raise
            if producer is self._producer:
                self._note(exc.args[0])

    def _serve_retired(self) -> None:
        """Serve the replaced clients' reports (under the poll lock); forget an empty one.

        A record produced into one after it was replaced (by a thread that took the client
        just before) is purged too: it must not land after a later record of its key, which
        the new client sends."""
        kept = []
        for old in self._retired:
            with contextlib.suppress(KafkaException):
                old.purge(blocking=False)
                old.poll(0)
            if len(old):
                kept.append(old)
        self._retired = kept

    def _retire(self, producer: Producer) -> None:
        with self._poll_lock:
            if producer not in self._retired:
                self._retired.append(producer)

    def wait(self, future: Future[Position], timeout: float | None = None) -> Position:
        """Wait for one record's acknowledgement, serving delivery reports meanwhile."""
        self._serve_until(future, timeout)
        return future.result()

    @property
    def _wait_limit_s(self) -> float:
        """How long a wait for one report lasts: the record's own timeout, plus a margin."""
        return self._settings.durable_timeout_s + 2.0

    def _serve_until(self, waiting: _Waiting, timeout: float | None) -> None:
        limit = self._wait_limit_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not waiting.done():
            if time.monotonic() > deadline:
                raise DurabilityError(f"no acknowledgement within {limit:.1f}s")
            self._poll_once(0.01, waiting)

    def _on_error(self, err: KafkaError) -> None:
        # Connection errors are retried by librdkafka; a record that cannot be delivered in
        # time fails through its own delivery report.  A fatal error kills the client.
        self._note(err)

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        *,
        partition: int | None = None,
    ) -> Future[Position]:
        """Queue one record and return a future resolved by its own delivery report.

        ``partition`` places it explicitly (None: the partitioner chooses by key)."""
        future: Future[Position] = Future()
        self._produce(topic, key, value, headers, _resolve_into(future), partition)
        return future

    def queue(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> Callable[[], Position]:
        """Queue one record and return the wait for its acknowledgement, served by the
        delivery thread (each waiter sleeps on its own record's lock, as ``append``'s do).

        Cheaper than :meth:`send`'s future for a caller that sends a record and waits for
        it later (a pipelined outcome, a batch of decisions).
        """
        self._start_background_poller()
        woken = _WakeSlot()
        self._produce(topic, key, value, headers, woken.settle)
        limit = self._wait_limit_s
        return lambda: woken.wait(limit)

    def send_async(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> asyncio.Future[Position]:
        """Queue one record and return an asyncio future resolved by its delivery report.

        The future fails with DurabilityError if no report came within the durable
        timeout (+2 s), as a synchronous wait would.
        """
        self._start_background_poller()
        loop = asyncio.get_running_loop()
        last = self._last_handoff
        handoff = None if last is None else last()
        if handoff is None or handoff.loop is not loop:
            handoff = self._handoffs.get(loop)
            if handoff is None:
                with self._lock:
                    handoff = self._handoffs.setdefault(loop, _LoopHandoff(loop))
            self._last_handoff = weakref.ref(handoff)
        future: asyncio.Future[Position] = loop.create_future()
        handoff.watch(future, self._wait_limit_s)
        self._produce(
            topic,
            key,
            value,
            headers,
            lambda outcome: handoff.settle(future, outcome),
        )
        return future

    def append(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> Position:
        """Produce one record and block until the broker acknowledged it.

        A thread alone serves its own report (see the module doc): its outcome lands in a
        plain slot, with no hand-off to another thread.  Once threads wait at the same
        time, the delivery thread serves every report and each thread sleeps on its own
        record's lock: threads taking turns at polling were measured to cap throughput
        (from 8 to 64 threads, no gain), since a report served for a thread that waited
        for the poll lock reached it only when the lock came its turn.
        """
        if self._poller is None and not self._poll_lock.locked():
            slot = _Slot()
            self._produce(topic, key, value, headers, slot.settle)
            self._serve_until(slot, None)
            return slot.result()
        return self.queue(topic, key, value, headers)()

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        settle: Callable[[Position | BaseException], None],
        partition: int | None = None,
    ) -> None:
        producer = self._client()
        # -1: no partition given, the partitioner chooses (librdkafka's RD_KAFKA_PARTITION_UA).
        placed = -1 if partition is None else partition

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            # A replaced client's reports (still served) say nothing of the current one.
            if err is not None:
                if producer is self._producer:
                    self._note(err)
                refused = self._refused
                if refusal(err, self._settings, "WRITE", f"TOPIC {topic}") is not None:
                    settle(self._refusal_of(err, topic))
                elif refused is not None and err.code() == KafkaError._PURGE_QUEUE:
                    settle(self._refusal_of(refused[0], topic))
                else:
                    settle(_refused(err, f"record not acknowledged: {err.str()}"))
            else:
                if producer is self._producer:
                    self._timeouts = 0
                settle(position_of(msg))

        deadline: float | None = None
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key,
                    headers=headers,  # type: ignore[arg-type]
                    on_delivery=on_delivery,
                    partition=placed,
                )
                if producer is not self._producer:  # replaced meanwhile: serve it still
                    self._retire(producer)
                return
            except BufferError:
                # The local queue is full: let deliveries drain, bounded by the durable timeout.
                if deadline is None:
                    deadline = time.monotonic() + self._settings.durable_timeout_s
                elif time.monotonic() > deadline:
                    raise DurabilityError("local produce queue stayed full") from None
                try:
                    self._poll_client(producer, 0.01)
                except KafkaException as exc:
                    raise DurabilityError(f"produce refused: {exc}") from exc
                fatal = self._fatal
                if fatal is not None:
                    raise DurabilityError(
                        f"produce refused: the client died: {fatal.str()}"
                    ) from None
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                # A client replaced meanwhile says nothing of its successor.
                if isinstance(error, KafkaError) and producer is self._producer:
                    self._note(error)
                if isinstance(error, KafkaError):
                    if refusal(error, self._settings, "WRITE", topic) is not None:
                        raise self._refusal_of(error, topic) from None
                    raise _refused(error, f"produce refused: {exc}") from exc
                raise DurabilityError(f"produce refused: {exc}") from exc

    def flush(self, timeout: float = 10.0) -> int:
        """Wait for every queued record (for shutdown and bulk tools, not per-record durability)."""
        with self._poll_lock:
            retired, self._retired = self._retired, []
        remaining = sum(_flush_retired(old, timeout) for old in retired)
        producer = self._producer
        if producer is None:
            return remaining
        try:
            return remaining + int(producer.flush(timeout))
        except KafkaException as exc:
            if not _is_fatal(exc):
                raise
            # The client died while flushing: what it held fails through its purge reports.
            self._note(exc.args[0])
            self._replace_after_fatal()
            return remaining + self.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued and stop the delivery thread."""
        remaining = self.flush(timeout)
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=1.0)
        held: list[Any] = [self._producer]
        self._producer = None
        drop_within(held, "producer")
        if remaining:
            raise DurabilityError(f"{remaining} records were not acknowledged before close")


def position_of(msg: Message) -> Position:
    """The topic, partition and offset of a delivered or consumed message."""
    return Position(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))


class _Waiting(Protocol):
    def done(self) -> bool: ...


class _Slot:
    """One record's outcome, set once by its delivery report (a minimal future)."""

    __slots__ = ("outcome",)

    def __init__(self) -> None:
        self.outcome: Position | BaseException | None = None

    def done(self) -> bool:
        return self.outcome is not None

    def settle(self, outcome: Position | BaseException) -> None:
        if self.outcome is None:
            self.outcome = outcome

    def result(self) -> Position:
        outcome = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome


class _WakeSlot:
    """One record's outcome and a lock its waiter sleeps on until the report releases it."""

    __slots__ = ("_ready", "outcome")

    def __init__(self) -> None:
        self.outcome: Position | BaseException | None = None
        self._ready = threading.Lock()
        self._ready.acquire()

    def settle(self, outcome: Position | BaseException) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self._ready.release()

    def wait(self, limit: float) -> Position:
        if not self._ready.acquire(timeout=limit):
            raise DurabilityError(f"no acknowledgement within {limit:.1f}s")
        self._ready.release()  # a second wait returns at once
        outcome = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome


class _LoopHandoff:
    """Delivery reports handed to one event loop in batches, and its futures' time limit.

    One ``producer.poll`` serves many reports; handing each over with its own
    ``call_soon_threadsafe`` cost a write to the loop's self-pipe and a wake-up per record.
    Reports queue here and one call drains
    them.  The time limit is a sweep over the futures in the order they were sent (all
    have the same limit), a second apart or at the oldest one's limit if sooner, not a
    timer per record (``asyncio.wait_for``).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the producer maps each loop to its handoff weakly, and a handoff holding
        # its loop (or futures of it, which do) would keep every loop that ever sent alive.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Position], Position | BaseException]] = []
        self._scheduled = False
        self._watched: collections.deque[tuple[float, asyncio.Future[Position]]] = (
            collections.deque()
        )
        self._sweeping = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop served (None once it is gone)."""
        return self._loop()

    def settle(self, future: asyncio.Future[Position], outcome: Position | BaseException) -> None:
        """From the delivery thread: resolve ``future`` on the loop, batched."""
        with self._lock:
            self._ready.append((future, outcome))
            if self._scheduled:
                return
            self._scheduled = True
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            # A closed loop: nobody awaits its futures any more, and each holds the loop.
            with self._lock:
                self._ready.clear()
                self._scheduled = False
            self._watched.clear()  # its thread runs no more

    def watch(self, future: asyncio.Future[Position], limit_s: float) -> None:
        """On the loop: fail ``future`` with DurabilityError if unresolved after ``limit_s``."""
        self._watched.append((time.monotonic() + limit_s, future))
        if not self._sweeping:
            self._sweeping = True
            future.get_loop().call_later(1.0, self._sweep)

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready, self._scheduled = self._ready, [], False
        for future, outcome in ready:
            if not future.done():  # on the loop's own thread: nothing cancels it meanwhile
                _set_outcome(future, outcome)
        # Forget the resolved futures at the head now: one left watched when the loop ends
        # (no sweep runs then) would keep the loop alive.
        watched = self._watched
        while watched and watched[0][1].done():
            watched.popleft()

    def _sweep(self) -> None:
        now = time.monotonic()
        watched = self._watched
        while watched and (watched[0][1].done() or watched[0][0] <= now):
            _, future = watched.popleft()
            if not future.done():
                future.set_exception(DurabilityError("no acknowledgement in time"))
        if watched:
            # At most a second apart, and no later than the oldest future's limit: all
            # have the same limit, so none fails later than its own (the head's is first).
            wait = min(1.0, max(watched[0][0] - now, 0.0))
            watched[0][1].get_loop().call_later(wait, self._sweep)
        else:
            self._sweeping = False


def _resolve_into(
    future: Future[Position] | asyncio.Future[Position],
) -> Callable[[Position | BaseException], None]:
    def settle(outcome: Position | BaseException) -> None:
        if future.done():
            return
        # The caller may cancel a ``send`` future between the check and the set.
        with contextlib.suppress(InvalidStateError, asyncio.InvalidStateError):
            _set_outcome(future, outcome)

    return settle


def _set_outcome(
    future: Future[Position] | asyncio.Future[Position], outcome: Position | BaseException
) -> None:
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _refused(err: KafkaError, message: str) -> DurabilityError:
    """The error of a record the broker or the client refused; too large is its own kind."""
    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return RecordTooLargeError(message)
    return DurabilityError(message)


#: How long after a refusal of this principal the producer tries a new client (an operator
#: may have granted the ACL meanwhile): a daemon refused says so and keeps running.
REFUSAL_RETRY_S = 5.0


def _is_login_or_cluster_refusal(err: KafkaError) -> bool:
    return err.code() in (
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
    )


def _dead(err: KafkaError) -> bool:
    """True for an error by which librdkafka declares a client dead.

    confluent-kafka never hands a fatal error to ``error_cb``: ``poll`` and ``flush`` raise
    it (``fatal()`` true, the real cause's code); every ``produce`` after it raises ``_FATAL``
    (``fatal()`` false).
    """
    return err.fatal() or err.code() == KafkaError._FATAL


def _flush_retired(old: Producer, timeout: float) -> int:
    """Serve a replaced client's last reports; what it still holds after ``timeout``."""
    try:
        return int(old.flush(timeout))
    except KafkaException:  # it died already: a second fatal error changes nothing
        return len(old)


def _is_fatal(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and _dead(err)


def _new_producer(conf: dict[str, Any]) -> Producer:
    try:
        return Producer(conf)
    except KafkaException as exc:
        raise BrokerError(f"invalid Kafka producer settings: {exc}", retryable=False) from exc
