"""Letting go of a librdkafka client without waiting on it forever.

librdkafka's destroy joins its broker threads, and after a broker went down and came back
one of them can keep a reference and never exit (confluentinc/librdkafka#4131 and #4674,
open upstream). Seen here: an agent paused across a graceful restart of the dev broker,
resumed, and its ``Ledger.close`` waited in the destroy until the chaos run killed it two
minutes later (gdb: the main thread in ``rd_kafka_destroy_app``, librdkafka's main thread
joining a broker thread that sat in its serve loop).

So a client is closed on a thread of its own and the caller waits at most
:data:`CLOSE_LIMIT_S`; past that it goes on, with a warning, and leaves the client behind
(a daemon thread, gone with the process).  Nothing is lost by it: a producer is flushed
before, and a fixed-partition consumer holds no group and commits nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

logger = logging.getLogger(__name__)

#: How long a caller waits for a client to close (a healthy one takes milliseconds).
CLOSE_LIMIT_S = 5.0


def close_within(close: Callable[[], object], what: str, limit: float | None = None) -> bool:
    """Run ``close`` on its own thread; False (and a warning) if it did not end in time.

    Errors from closing a client the broker lost are not worth reporting.
    """
    bound = CLOSE_LIMIT_S if limit is None else limit
    done = threading.Event()

    def run() -> None:
        try:
            with contextlib.suppress(KafkaException, RuntimeError):
                close()
        finally:
            done.set()

    threading.Thread(target=run, name="stepledger-close", daemon=True).start()
    if done.wait(bound):
        return True
    logger.warning(
        "the Kafka %s did not close within %.0fs (librdkafka's destroy waiting on a broker "
        "thread after a broker restart, confluentinc/librdkafka#4674): left behind",
        what,
        bound,
    )
    return False


def drop_within(held: list[Any], what: str, limit: float | None = None) -> bool:
    """Drop the references in ``held`` on their own thread, waiting as :func:`close_within`
    (a producer is destroyed when its last reference goes).

    The caller passes the list holding its only reference (a reference in an argument
    would stay on the caller's stack for the call, and the destroy would run there).
    """
    return close_within(held.clear, what, limit)
