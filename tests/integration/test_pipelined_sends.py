"""Pipelined sends on a real broker (the recovery daemon's appends): many threads sending
events back to back, each waiting once for all of its own; order per workflow kept."""

from __future__ import annotations

import threading

import pytest

from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.factory import EventFactory
from stepledger.errors import DurabilityError
from stepledger.kafka.reader import read_topic
from stepledger.log import KafkaEventLog
from stepledger_dev.broker import free_port

WORKFLOWS, PER_WORKFLOW = 8, 12


def test_sends_from_many_threads_land_in_order_per_workflow(settings: Settings) -> None:
    log, factory = KafkaEventLog(settings), EventFactory("fleet", "recovery")
    sent: dict[str, list[str]] = {}
    positions: dict[str, list[int]] = {}

    def resolve(w: int) -> None:
        workflow = f"wf-{w}"
        events = [
            factory.outcome(workflow, f"s{i}", attempt=1, status=OutcomeStatus.SUCCEEDED)
            for i in range(PER_WORKFLOW)
        ]
        acks = [log.send(e) for e in events]  # back to back, nothing awaited in between
        positions[workflow] = [ack().offset for ack in acks]
        sent[workflow] = [e.event_id for e in events]

    threads = [threading.Thread(target=resolve, args=(w,)) for w in range(WORKFLOWS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    log.close()
    assert len(sent) == WORKFLOWS
    for workflow, offsets in positions.items():
        assert offsets == sorted(offsets) and len(set(offsets)) == PER_WORKFLOW, workflow
    read: dict[str, list[str]] = {}
    for record in read_topic(settings, Codec(), idle_timeout=0.3):
        assert record.event is not None
        read.setdefault(record.event.workflow_id, []).append(record.event.event_id)
    assert read == sent


def test_a_send_to_an_unreachable_broker_fails_within_the_durable_timeout() -> None:
    settings = Settings(bootstrap=f"127.0.0.1:{free_port()}", topic="t", durable_timeout_s=0.5)
    log = KafkaEventLog(settings)
    event = EventFactory("f", "p").outcome("wf", "s", attempt=1, status=OutcomeStatus.FAILED)
    ack = log.send(event)
    with pytest.raises(DurabilityError):
        ack()
    log.close()
