"""Shared fixtures: a real Kafka-protocol broker on loopback, unique topics, settings factories.

Set ``STEPLEDGER_TEST_BOOTSTRAP=HOST:PORT`` to run every test against that broker (for
example Apache Kafka from docker-compose.yml) instead of the bundled Tansu broker.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepledger.broker import LocalBroker
from stepledger.config import Settings
from stepledger.kafka import ensure_topics

Factory = Callable[..., Settings]


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of the broker every integration test talks to."""
    external = os.environ.get("STEPLEDGER_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with LocalBroker(log_path=log) as broker:
        yield broker.bootstrap


def unique(prefix: str) -> str:
    """A name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_settings(bootstrap: str) -> Factory:
    """Build settings on the test broker with a fresh topic and dead-letter topic per call."""

    def build(*, create: bool = True, partitions: int = 3, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "bootstrap": bootstrap,
            "topic": unique("events"),
            "dlq_topic": unique("dlq"),
            "fleet_id": "test-fleet",
            "producer_id": "test",
            "durable_timeout_s": 10.0,
        }
        values.update(overrides)
        settings = Settings(**values)
        if create:
            ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=partitions)
        return settings

    return build


@pytest.fixture
def settings(make_settings: Factory) -> Settings:
    """Settings with a fresh topic on the test broker."""
    return make_settings()


@pytest.fixture
def src_env() -> dict[str, str]:
    """Environment for subprocesses that import stepledger from this checkout."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src}
