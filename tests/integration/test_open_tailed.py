"""Opening a workflow over a partition the index tails: start first, read through it.

- An id the tail never saw is started before anything is read, and the read ends at that
  started event: no assignment, no fresh end, one started event in the log.
- The assumption broken: another process records the id (or claims its next attempt) past
  where the tail had read.  The open's claim lands after it and owns nothing (one
  competing claim), and the open goes on as one that read after that record would: it
  claims the next attempt of a running workflow, replays a finished one.  The step the
  other process ran replays its result: nothing is called twice.
- A workflow the process finished itself is never claimed after its end.
- A resume's claim is read back through the claim itself (no assignment either).
- An idle tail is unassigned, and an unseen id then takes the read-first path; so is a tail
  that ran ahead of every lookup (an agent stepping on after its open).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from stepledger.config import Settings
from stepledger.domain.events import Event
from stepledger.domain.state import WorkflowState, replay
from stepledger.domain.tools import Tool
from stepledger.errors import DurabilityError
from stepledger.history import index as indexes
from stepledger.history.kafka import KafkaHistory
from stepledger.kafka import ensure_topics
from stepledger.producer import Ledger
from stepledger_dev.apache_kafka import KafkaBroker
from tests.integration.test_partition_index import WRITER

PAY = Tool(name="pay", keyed=True)


@pytest.fixture
def settings(make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A one-partition topic; the tail stays assigned however slow the host."""
    monkeypatch.setattr(indexes, "TAIL_IDLE_S", 60.0)
    return make_settings(partitions=1)


def _elsewhere(settings: Settings, env: dict[str, str], script: str, workflow_id: str) -> bytes:
    """Run a script in another process against the topic; what it printed."""
    argv = [sys.executable, "-c", script, settings.bootstrap, settings.topic, workflow_id]
    return subprocess.run(argv, check=True, env=env, timeout=60, capture_output=True).stdout


def _replays(wf: Any) -> None:
    """The workflow's pay step returns the other runner's result; nothing is called again."""
    calls: list[int] = []
    assert wf.step("pay", PAY, {"n": 1}, lambda a, k: _called(calls, "again")) == "paid"
    assert calls == []


def _reader(ledger: Ledger) -> KafkaHistory:
    history = ledger.history
    assert isinstance(history, KafkaHistory)
    return history


def _unseen(ledger: Ledger, workflow_id: str) -> bool:
    known = _reader(ledger).known(workflow_id)
    return known is not None and not known.events


def _called(calls: list[int], result: str) -> str:
    calls.append(1)
    return result


def _types(ledger: Ledger, workflow_id: str) -> list[str]:
    return [e.type for e in ledger.history.read(workflow_id).events]


def test_an_unseen_id_is_started_first_and_read_through_its_started_event(
    settings: Settings,
) -> None:
    with Ledger(settings) as ledger:
        ledger.workflow("first").finish()  # read first: the index now tails the partition
        index = _reader(ledger).index
        assert index.tailing == {(settings.topic, 0)}
        assigned = index.assignments
        assert _unseen(ledger, "second")
        wf = ledger.workflow("second")
        assert index.assignments == assigned  # the tail read through the started event
        assert wf.attempt == 1 and wf.state.runner == wf.runner and wf.epoch == 1
        calls: list[int] = []
        wf.step("pay", PAY, {"n": 1}, lambda a, k: _called(calls, "paid"))
        wf.finish()
        assert calls == [1]
        assert _types(ledger, "second") == [
            "workflow_started",
            "step_intended",
            "step_outcome",
            "workflow_finished",
        ]
        assert not _unseen(ledger, "second")


def test_an_id_another_process_started_past_the_tail_is_resumed_not_run_again(
    settings: Settings, src_env: dict[str, str]
) -> None:
    with Ledger(settings) as ledger:
        ledger.workflow("first").finish()  # tailing from offset 0
        _elsewhere(settings, src_env, WRITER, "late")
        assert _unseen(ledger, "late")  # the tail has not read it: a wrong hint
        # Started first, found the other runner's history before it: its started event owns
        # nothing, and the open goes on as one that read after that history: attempt 2.
        wf = ledger.workflow("late")
        assert wf.attempt == 2 and wf.state.runner == wf.runner and wf.epoch == 2
        assert [a.kind for a in wf.state.anomalies] == ["competing_claim"]
        _replays(wf)  # the other process's call: nothing ran twice
        wf.finish()
        assert _types(ledger, "late") == [
            "workflow_started",
            "step_intended",
            "step_outcome",
            "workflow_started",
            "workflow_resumed",
            "workflow_finished",
        ]


def test_an_id_another_process_finished_past_the_tail_replays_finished(
    settings: Settings, src_env: dict[str, str]
) -> None:
    with Ledger(settings) as ledger:
        ledger.workflow("first").finish()
        _elsewhere(settings, src_env, WRITER + "    wf.finish()\n", "done")
        wf = ledger.workflow("done")  # started first, the log says finished: replayed
        assert wf.finished
        _replays(wf)


def test_a_resume_reads_its_claim_back_through_the_tail(
    settings: Settings,
) -> None:
    with Ledger(settings) as writer:
        writer.start("again").step("pay", PAY, {"n": 1}, lambda a, k: "paid")
    with Ledger(settings) as ledger:
        index = _reader(ledger).index
        wf = ledger.workflow("again")  # read first (the id is known), claim, read through it
        assert wf.attempt == 2 and index.assignments == 1
        assert [e.type for e in ledger.history.read("again").events][-1] == "workflow_resumed"


@pytest.mark.parametrize("path", ["read first", "claimed first from the tail"])
def test_a_resume_folds_what_it_read_once_and_holds_the_fold_of_the_log(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """On the broker, the claim's read back begins with the events the open read (whichever
    way it read them): each is folded once, the claim twice (into the state and onto the
    kept fold), and the state is the fold of the workflow read afresh."""
    folded: list[str] = []
    apply = WorkflowState.apply

    def counted(state: WorkflowState, event: Event) -> object:
        folded.append(event.event_id)
        return apply(state, event)

    with Ledger(settings) as writer:
        wf = writer.start("long")
        for n in range(20):
            wf.step(f"s{n}", PAY, {"n": n}, lambda a, k: "paid")
    with Ledger(settings) as ledger:
        if path != "read first":
            ledger.workflow("other").finish()  # the tail reads long's records
        index = _reader(ledger).index
        assigned = index.assignments
        monkeypatch.setattr(WorkflowState, "apply", counted)
        resumed = ledger.workflow("long")
        opened = Counter(folded)
        if path != "read first":
            assert index.assignments == assigned  # claimed from the tail, no read first
        logged = ledger.history.read("long").events
        assert resumed.attempt == 2 and logged[-1].type == "workflow_resumed"
        assert {opened[e.event_id] for e in logged[:-1]} == {1}
        assert opened[logged[-1].event_id] == 2
        assert resumed.state == replay("long", logged)


def test_an_idle_tail_is_unassigned_and_an_unseen_id_is_read_first(
    make_settings: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexes, "TAIL_IDLE_S", 0.2)
    settings = make_settings(partitions=1)
    with Ledger(settings) as ledger:
        ledger.workflow("first").finish()
        index = _reader(ledger).index
        limit = time.monotonic() + 10
        while index.tailing:
            assert time.monotonic() < limit, "the idle tail was not unassigned"
            time.sleep(0.02)
        assert not _unseen(ledger, "second")
        assigned = index.assignments
        assert ledger.workflow("second").attempt == 1
        assert index.assignments == assigned + 1  # the read-first path assigned afresh


def test_a_tail_run_ahead_of_every_lookup_is_unassigned_before_its_idle_time(
    make_settings: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent stepping on after its open: the tail stops fetching its records once more
    than TAIL_AHEAD_RECORDS are past where the index read, long before the idle time, and
    not before."""
    monkeypatch.setattr(indexes, "TAIL_IDLE_S", 600.0)
    monkeypatch.setattr(indexes, "TAIL_AHEAD_RECORDS", 8)
    settings = make_settings(partitions=1)
    with Ledger(settings) as ledger:
        wf = ledger.workflow("stepping")
        index = _reader(ledger).index
        assert index.tailing
        where = (settings.topic, 0)
        kept_within = []
        steps, limit = 0, time.monotonic() + 60
        while index.tailing:
            assert time.monotonic() < limit, "a tail 600 s from idle kept fetching ahead"
            wf.step(f"s{steps}", PAY, {"n": steps}, lambda a, k: "paid")
            steps += 1
            assert wf.position is not None
            ahead = _fetched_past_index(index, where, wf.position.offset + 1, limit)
            if ahead is not None and ahead <= 8:
                # The cached end shows every record so far: within the bound, the tail stays.
                assert index._untail_if_idle() and index.tailing
                kept_within.append(ahead)
            elif ahead is not None:  # past the bound (if the reaper has not untailed it yet)
                assert not index._untail_if_idle() and not index.tailing
        assert kept_within and max(kept_within) > 4  # kept while up to 8 records ahead
        assigned = index.assignments
        assert ledger.workflow("second").attempt == 1
        assert index.assignments == assigned + 1  # read first again: assigned afresh


def _fetched_past_index(
    index: indexes.PartitionIndex, where: tuple[str, int], end: int, limit: float
) -> int | None:
    """Records past where the index read, once the tail's cached end reached ``end``
    (None: the tail was unassigned meanwhile)."""
    while True:
        with index._cond:
            if where not in index._tailing:
                return None
            ahead = index._ahead(where)
            if ahead is not None and ahead[0] >= end:
                return ahead[0] - ahead[1]
        assert time.monotonic() < limit, "the tail never fetched the records written"
        time.sleep(0.005)


RESUMER = """
import sys
from stepledger.config import Settings
from stepledger_dev.apache_kafka import KafkaBroker
from stepledger.producer import Ledger
bootstrap, topic, workflow_id = sys.argv[1:4]
with Ledger(Settings(bootstrap=bootstrap, topic=topic, producer_id="other")) as ledger:
    print(ledger.workflow(workflow_id).attempt)
"""


def test_a_running_workflow_the_tail_holds_is_claimed_first_and_read_through_the_claim(
    settings: Settings,
) -> None:
    with Ledger(settings) as ledger:
        first = ledger.workflow("r")  # read first
        ledger.workflow("s").finish()  # the tail reads r's started event
        first.step("pay", PAY, {"n": 1}, lambda a, k: "paid")  # not read by the tail yet
        index = _reader(ledger).index
        assigned = index.assignments
        wf = ledger.workflow("r")  # another agent of the process takes the workflow over
        assert index.assignments == assigned
        assert wf.attempt == 2 and wf.epoch == 2 and wf.state.anomalies == []
        _replays(wf)


def test_a_claim_from_the_tail_that_loses_to_one_it_had_not_read_claims_again(
    settings: Settings, src_env: dict[str, str]
) -> None:
    with Ledger(settings) as ledger:
        ledger.workflow("r").step("pay", PAY, {"n": 1}, lambda a, k: "paid")
        ledger.workflow("s").finish()  # the tail reads r's step records too
        assert _elsewhere(settings, src_env, RESUMER, "r").split() == [b"2"]  # attempt 2
        wf = ledger.workflow("r")  # the tail still says attempt 1: claims 2, loses, claims 3
        assert wf.attempt == 3 and wf.epoch == 3 and wf.state.runner == wf.runner
        assert [a.kind for a in wf.state.anomalies] == ["competing_claim"]
        _replays(wf)


def test_a_workflow_this_process_finished_is_not_claimed_after_its_end(
    settings: Settings,
) -> None:
    with Ledger(settings) as ledger:
        wf = ledger.workflow("w")
        ledger.workflow("s").finish()  # the tail reads w's started event
        wf.step("pay", PAY, {"n": 1}, lambda a, k: "paid")
        wf.finish()  # not read by the tail yet: noted, so w's kept history is not handed out
        assert _reader(ledger).index.tailed((settings.topic, 0), b"w") is None
        again = ledger.workflow("w")
        assert again.finished and again.state.anomalies == []
        assert _types(ledger, "w")[-1] == "workflow_finished"  # no claim after the end


def test_an_id_this_process_started_is_never_taken_for_unseen(
    settings: Settings,
) -> None:
    with Ledger(settings) as ledger:
        ledger.workflow("first").finish()  # tailing
        ledger.start("own")  # written, not read by the tail
        assert not _unseen(ledger, "own")
        wf = ledger.workflow("own")
        assert wf.attempt == 2 and wf.state.anomalies == []


def test_coroutines_open_unseen_ids_and_go_on_after_a_lost_start_as_threads_do(
    settings: Settings, src_env: dict[str, str]
) -> None:

    async def main(ledger: Ledger) -> None:
        await (await ledger.aworkflow("first")).afinish()  # read first: tailing now
        index = _reader(ledger).index
        assigned = index.assignments
        opened = await asyncio.gather(*(ledger.aworkflow(f"a-{n}") for n in range(8)))
        assert [wf.attempt for wf in opened] == [1] * 8
        assert all(wf.state.runner == wf.runner for wf in opened)
        assert index.assignments == assigned
        _elsewhere(settings, src_env, WRITER, "late")
        wf = await ledger.aworkflow("late")  # started first, lost: goes on as attempt 2
        assert wf.attempt == 2
        calls: list[int] = []
        done = await wf.astep("pay", PAY, {"n": 1}, lambda a, k: _called(calls, "again"))
        assert done == "paid" and calls == []

    with Ledger(settings) as ledger:
        asyncio.run(main(ledger))
        for n in range(8):
            assert _types(ledger, f"a-{n}") == ["workflow_started"]


@pytest.mark.kafka_only
@pytest.mark.skipif(shutil.which("java") is None, reason="needs java for Apache Kafka")
def test_opens_claim_first_through_a_tail_whose_broker_was_killed_and_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail's consumer outlives a SIGKILL of the broker: opens after the restart read
    through their claims on it, and nothing is started twice or run again."""
    monkeypatch.setattr(indexes, "TAIL_IDLE_S", 600.0)
    with KafkaBroker(nodes=1, log_dir=tmp_path / "kafka") as cluster:
        settings = Settings(bootstrap=cluster.bootstrap, topic="events", producer_id="test")
        ensure_topics(settings, [settings.topic, settings.dlq_topic], partitions=1)
        with Ledger(settings) as ledger:
            ledger.workflow("first").step("pay", PAY, {"n": 1}, lambda a, k: "paid")
            ledger.workflow("other").finish()  # the tail reads first's records
            index = _reader(ledger).index
            assigned = index.assignments
            cluster.kill_node(1)
            cluster.restart_node(1)
            _await_leader(settings)  # recovery after SIGKILL: writes before it time out
            _await_writes(ledger)
            assert _unseen(ledger, "second")
            wf = ledger.workflow("second")
            again = ledger.workflow("first")  # claimed first from the tail, after the restart
            assert index.assignments == assigned  # the tail carried on through the restart
            assert wf.attempt == 1 and _types(ledger, "second") == ["workflow_started"]
            assert again.attempt == 2 and again.state.anomalies == []
            _replays(again)


def _await_leader(settings: Settings, timeout: float = 60.0) -> None:
    """Poll, bounded, until the topic's partition has a leader again."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    limit = time.monotonic() + timeout
    while True:
        topic = admin.list_topics(timeout=5).topics.get(settings.topic)
        if topic is not None and topic.error is None and topic.partitions[0].leader >= 0:
            return
        assert time.monotonic() < limit, "the restarted broker never led the partition"
        time.sleep(0.1)


def _await_writes(ledger: Ledger, tries: int = 5) -> None:
    """Write until the ledger's producer is acknowledged again (bounded): after a SIGKILL of
    its broker, its first record may time out while the partition recovers."""
    for n in range(tries):
        try:
            ledger.start(f"probe-{n}")
            return
        except DurabilityError:
            continue
    pytest.fail(f"no write acknowledged in {tries} tries after the restart")
