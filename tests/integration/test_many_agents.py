"""Many agent threads in one process: every durable write waits for its own acknowledgement.

Once threads wait at the same time the producer's delivery thread serves every report and
each thread sleeps on its own record: each still returns only once its own record is
acknowledged (its position is where it landed), and a record that cannot be made durable
fails its own thread in time, never hangs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import stepledger as sl
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.errors import DurabilityError
from stepledger.kafka import DurableProducer, Position
from stepledger.kafka.reader import read_topic

AGENTS = 32
STEPS = 10


@sl.tool(keyed=True)
def act(i: int, *, idempotency_key: str) -> int:
    """A trivial tool."""
    return i


def _in_threads(agents: int, body: Callable[[int], object]) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(a: int) -> None:
        try:
            body(a)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(a,)) for a in range(agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()
    return errors


def test_concurrent_agents_each_get_their_own_acknowledged_records(settings: Settings) -> None:
    positions: dict[str, list[Position]] = {}
    with sl.Ledger(settings, tools=[act]) as ledger:

        def agent(a: int) -> None:
            wf = ledger.start(f"agent-{a}")
            mine = positions.setdefault(wf.workflow_id, [])
            for i in range(STEPS):
                assert wf.step(f"s{i}", act, i=i) == i
                assert wf.position is not None
                mine.append(wf.position)
            wf.finish()

        assert _in_threads(AGENTS, agent) == []
    records = read_topic(settings, Codec(), max_time=60)
    landed = {(r.position.partition, r.position.offset): r for r in records}
    assert len(positions) == AGENTS
    for workflow_id, mine in positions.items():
        assert len(mine) == STEPS
        for position in mine:  # each step's outcome is where its wait said it landed
            record = landed[(position.partition, position.offset)]
            assert record.event is not None and record.event.workflow_id == workflow_id


def test_records_that_cannot_be_made_durable_fail_each_waiting_thread() -> None:
    unreachable = Settings(bootstrap="127.0.0.1:9", topic="nowhere", durable_timeout_s=1.0)
    producer = DurableProducer(unreachable)
    began = time.monotonic()
    errors = _in_threads(8, lambda a: producer.append("nowhere", b"k", b"v"))
    assert len(errors) == 8 and all(isinstance(e, DurabilityError) for e in errors), errors
    assert time.monotonic() - began < 10
    producer.close(timeout=1.0)  # every record failed through its own report: none is left
