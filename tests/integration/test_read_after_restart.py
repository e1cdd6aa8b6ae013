"""Reads to a partition's end finish after the dev broker restarted on durable storage.

After a graceful restart Tansu reads its storage again, and a fetch comes back empty until
it assembled its answer: every 10 ms fetch of a resume's read to the end came back empty,
so the read failed after its time limit, every time (a chaos run's agents lost two minutes
to it).  The read's fetch wait now grows while the broker answers nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import stepledger as sl
from stepledger.codec import Codec
from stepledger.history import records as workflows
from stepledger.history.records import read_to_end
from stepledger.kafka import ensure_topics
from stepledger.kafka.topics import step_log_config
from stepledger_dev.broker import LocalBroker, S3Storage

WORKFLOWS = 40


@sl.tool(keyed=True, name="act")
def act(i: int, *, idempotency_key: str) -> int:
    return i


@pytest.mark.own_tansu
def test_a_read_to_the_end_finishes_after_a_graceful_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflows, "READ_LIMIT_S", 30.0)  # before: failed at the limit
    storage = S3Storage().start()
    try:
        _write_restart_read(tmp_path, storage)
    finally:
        storage.stop()


def _write_restart_read(tmp_path: Path, storage: S3Storage) -> None:
    with LocalBroker(storage=storage, log_path=tmp_path / "broker.log") as broker:
        settings = sl.Settings(
            bootstrap=broker.bootstrap, topic="events", dlq_topic="dlq", producer_id="test"
        )
        configs = {settings.topic: step_log_config()}
        ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=1, configs=configs)
        with sl.Ledger(settings, tools=[act]) as ledger:
            for n in range(WORKFLOWS):
                wf = ledger.start(f"wf-{n}")
                wf.step("s0", act, i=n)
                wf.finish()
        broker.restart()
        starts = {(settings.topic, 0): 0}
        events, scanned = read_to_end(settings, Codec(), starts, "wf-7")
        assert scanned == 4 * WORKFLOWS  # start, intent, outcome, finish each
        assert [e.workflow_id for e in events] == ["wf-7"] * 4
