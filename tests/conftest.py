"""Shared fixtures: a real Kafka-protocol broker on loopback, unique topics, settings factories.

The broker engine is ``--engine kafka|tansu`` or ``STEPLEDGER_TEST_ENGINE``.  The default is
Apache Kafka (a 1-node KRaft cluster started by ``stepledger_dev.apache_kafka.KafkaBroker``)
when ``java`` is on PATH, else the bundled Tansu broker.  Set
``STEPLEDGER_TEST_BOOTSTRAP=HOST:PORT`` to run every test against a broker you started.
"""

from __future__ import annotations

from tests import young_clock

young_clock.install()  # before stepledger is imported: see the module

import os
import shutil
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.kafka import ensure_topics
from stepledger.kafka.topics import step_log_config
from stepledger_dev.apache_kafka import KafkaBroker, Security
from stepledger_dev.broker import LocalBroker


def _lake_installed() -> bool:
    """True where the ``[lake]`` extra's DuckDB and extension wheels are (CI's lake venv)."""
    from importlib.metadata import PackageNotFoundError, version

    from stepledger.readers.lake import LAKE_DUCKDB

    try:
        return version("duckdb") == LAKE_DUCKDB and bool(version("duckdb-extension-ducklake"))
    except PackageNotFoundError:
        return False


#: The lake's tests run where the lake can (``.ci/run`` gives them a venv of their own with the
#: ``[lake]`` extra); elsewhere they are not collected at all: a skipped test is no pass.
collect_ignore = [] if _lake_installed() else ["lake"]

# A test run started in the background of a non-interactive shell (`cmd &`, a CI runner's
# script) inherits SIGINT ignored, and every process it starts inherits that too: the tests
# that press Ctrl-C on a child (the demo, `query`) then wait out their timeouts.  Taking
# SIGINT back here gives every child the default, as an interactive shell would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

Factory = Callable[..., Settings]


ENGINES = ("kafka", "tansu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        choices=ENGINES,
        default=None,
        help="Broker for integration and e2e tests (default: STEPLEDGER_TEST_ENGINE, else "
        "kafka when java is on PATH, else tansu).",
    )


def broker_engine(config: pytest.Config) -> str:
    """The engine chosen by option, environment or what the machine has."""
    chosen = config.getoption("--engine") or os.environ.get("STEPLEDGER_TEST_ENGINE")
    if chosen:
        if chosen not in ENGINES:
            raise pytest.UsageError(f"STEPLEDGER_TEST_ENGINE must be one of {ENGINES}")
        return str(chosen)
    return "kafka" if shutil.which("java") else "tansu"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A session on Tansu skips the tests of Apache Kafka itself (they start their own); a
    session on Kafka skips the tests that start a Tansu of their own whatever the engine
    (CI's Tansu pass runs them), so neither runs twice."""
    if os.environ.get("STEPLEDGER_TEST_BOOTSTRAP"):
        return
    on_tansu = broker_engine(config) == "tansu"
    marker, reason = (
        ("kafka_only", "an Apache Kafka test; this session runs on Tansu")
        if on_tansu
        else ("own_tansu", "starts a Tansu of its own: run by the Tansu pass (--engine tansu)")
    )
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker(marker):
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str:
    external = os.environ.get("STEPLEDGER_TEST_BOOTSTRAP")
    return f"broker: {external}" if external else f"broker engine: {broker_engine(config)}"


@pytest.fixture(scope="session")
def engine(request: pytest.FixtureRequest) -> str:
    """``external`` for STEPLEDGER_TEST_BOOTSTRAP, else ``kafka`` or ``tansu``."""
    if os.environ.get("STEPLEDGER_TEST_BOOTSTRAP"):
        return "external"
    return broker_engine(request.config)


@pytest.fixture(scope="session")
def bootstrap(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of the broker every integration test talks to."""
    if engine == "external":
        yield os.environ["STEPLEDGER_TEST_BOOTSTRAP"]
        return
    logs = tmp_path_factory.mktemp("broker")
    if engine == "kafka":
        with KafkaBroker(log_dir=logs) as kafka:
            yield kafka.bootstrap
        return
    with LocalBroker(log_path=logs / "tansu.log") as broker:
        yield broker.bootstrap


@pytest.fixture(scope="module")
def secure_kafka(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A secured Apache Kafka of the module's own: SASL/SCRAM clients, ACLs enforced, a super
    user whose librdkafka settings are ``client_settings``."""
    if engine != "kafka":
        pytest.skip("a secured Apache Kafka test (needs --engine kafka)")
    logs = tmp_path_factory.mktemp("secure-broker")
    with KafkaBroker(log_dir=logs, security=Security()) as kafka:
        yield kafka


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
            "checkpoint_topic": unique("checkpoints"),
            "fleet_id": "test-fleet",
            "producer_id": "test",
            "durable_timeout_s": 10.0,
        }
        values.update(overrides)
        settings = Settings(**values)
        if create:
            # As `stepledger init` makes them: the step log keeps every record.
            configs = {settings.topic: step_log_config()}
            topics = [settings.topic, settings.dlq_topic]
            ensure_topics(settings, topics, partitions=partitions, configs=configs)
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
