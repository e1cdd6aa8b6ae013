"""Topics `ensure_topics` created are there for the next client, at once, on a real broker.

Apache Kafka acknowledged a create before its broker listed the topic: under load (CI with
two test workers) a projector started right after the create stopped on "topic ... does
not exist".  Here the machine is kept busy by processes that only spin, as that run's was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from stepledger.config import Settings
from stepledger.kafka import ensure_topics, topic_partitions
from tests.conftest import unique

SPIN = (
    "import os, time\nos.nice(19)\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"
)


@pytest.fixture
def busy() -> Iterator[None]:
    """Every core kept busy (for at most a minute each, and stopped after the test)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)


def test_every_created_topic_is_listed_by_a_new_client_right_after_the_create(
    bootstrap: str, busy: None
) -> None:
    settings = Settings(bootstrap=bootstrap)
    for _ in range(5):
        topics = [unique("created") for _ in range(10)]
        ensure_topics(settings, topics, partitions=4)
        for topic in topics:  # a new admin client each, as a daemon started now would ask
            assert topic_partitions(settings, topic) == [0, 1, 2, 3]
