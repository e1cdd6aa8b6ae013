"""Checkpointers share the partitions through their consumer group, through kills and additions.

Two ``stepledger checkpoint`` processes on a 4-partition step log (Apache Kafka), one
SIGKILLed while workflows keep coming, then a third added: after each change every
partition's directory root covers the log's end, and a fresh reader finds every workflow
through the directory, with the same answer as reading the whole checkpoint partition and
the workflow's records exactly as the step log holds them up to the checkpoint.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.view import CheckpointView, Covering
from stepledger.config import Settings
from stepledger.domain.enums import OutcomeStatus
from stepledger.domain.tools import Tool
from stepledger.kafka import ensure_topics
from stepledger.kafka.reader import PartitionReader
from stepledger.kafka.topics import checkpoint_topic_config
from stepledger.producer import Ledger
from tests.conftest import Factory

pytestmark = [pytest.mark.e2e, pytest.mark.kafka_only, pytest.mark.timeout(120)]

CLI = [sys.executable, "-m", "stepledger"]
CHARGE = Tool(name="charge", effect="idempotent")
PARTITIONS = 4
MOVED = re.compile(r"partitions (assigned|revoked|lost): \[([0-9, ]*)\]")
EVERY = set(range(PARTITIONS))


def append_workflows(settings: Settings, prefix: str, count: int) -> None:
    """``count`` workflows of one or two charged steps (every other left running)."""
    with Ledger(settings) as ledger:
        factory, log = ledger.events, ledger.log
        for i in range(count):
            wf = f"{prefix}-{i}"
            log.append(
                factory.workflow_started(wf, name="t", attempt=1, read_only=False, max_attempts=5)
            )
            for s in range(i % 2 + 1):
                log.append(factory.intent(wf, f"s{s}", CHARGE, {"n": s}, sequence=s))
                ok = OutcomeStatus.SUCCEEDED
                log.append(factory.outcome(wf, f"s{s}", attempt=1, status=ok, result=s))


def step_log(settings: Settings) -> dict[int, dict[bytes, list[tuple[int, bytes]]]]:
    """Per partition, each workflow's (offset, value) records, read from the step log."""
    found: dict[int, dict[bytes, list[tuple[int, bytes]]]] = {p: {} for p in range(PARTITIONS)}
    starts = {(settings.topic, p): 0 for p in range(PARTITIONS)}
    with PartitionReader(settings, group="test-checkpointer-group") as reader:
        for batch in reader.to_end(starts, within=30):
            for r in batch:
                found[r.partition].setdefault(r.key or b"", []).append((r.offset, r.value or b""))
    return found


def root_progress(settings: Settings, partition: int) -> int:
    """The progress of the directory root the checkpoint partition's last record names."""
    where = (settings.checkpoint_topic, partition)
    with PartitionReader(settings, group="test-checkpointer-group") as reader:
        _, high = reader.watermarks(where)
        if high == 0:
            return -1
        last = next(r for b in reader.to_end({where: high - 1}, within=10) for r in b)
        pointer = last.offset if last.key == dirs.ROOT_KEY else dirs.root_pointer(last.headers)
        if pointer is None:
            return -1
        root = next(r for b in reader.to_end({where: pointer}, within=10) for r in b)
    return dirs.decode(root.value).progress


def roots_cover_the_log(settings: Settings, timeout: float, what: str) -> None:
    ends = {
        p: max((o for rs in wfs.values() for o, _ in rs), default=-1)
        for p, wfs in step_log(settings).items()
    }
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(root_progress(settings, p) >= end for p, end in ends.items()):
            return
        time.sleep(0.3)
    shown = {p: root_progress(settings, p) for p in ends}
    raise AssertionError(f"{what}: roots at {shown}, the log ends at {ends}")


def held(log: Path) -> set[int]:
    """The partitions a member holds now, as its log tells (assigned, then revoked or lost)."""
    now: set[int] = set()
    for m in MOVED.finditer(log.read_text() if log.exists() else ""):
        numbers = {int(n) for n in m.group(2).split(",") if n.strip()}
        now = now | numbers if m.group(1) == "assigned" else now - numbers
    return now


def split(*logs: Path) -> bool:
    """Each member holds some partitions, no two the same one, and together all of them."""
    sets = [held(log) for log in logs]
    return all(sets) and sum(map(len, sets)) == PARTITIONS and set().union(*sets) == EVERY


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_checkpointers_share_partitions_through_a_kill_and_an_addition(
    make_settings: Factory, src_env: dict[str, str], tmp_path: Path
) -> None:
    settings = make_settings(partitions=PARTITIONS)
    config = {settings.checkpoint_topic: checkpoint_topic_config()}
    ensure_topics(settings, [settings.checkpoint_topic], partitions=PARTITIONS, configs=config)
    env = {**src_env, "STEPLEDGER_CHECKPOINT_TOPIC": settings.checkpoint_topic}
    where = ["--bootstrap", settings.bootstrap, "--topic", settings.topic]
    argv = [*CLI, "checkpoint", *where, "--every", "0.3", "--session-timeout", "2"]
    members: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> Path:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as out:
            members[name] = subprocess.Popen(argv, env=env, stdout=out, stderr=out)
        return log

    append_workflows(settings, "one", 24)
    try:
        a_log, b_log = start("a"), start("b")
        wait_for(lambda: split(a_log, b_log), 30, "the two members to split the partitions")
        roots_cover_the_log(settings, 20, "two members")

        members["a"].send_signal(signal.SIGKILL)
        members["a"].wait(timeout=10)
        append_workflows(settings, "two", 24)
        wait_for(lambda: held(b_log) == EVERY, 20, "the survivor to take every partition")
        roots_cover_the_log(settings, 20, "after a member was killed")

        c_log = start("c")
        wait_for(lambda: split(b_log, c_log), 20, "the added member to be given partitions")
        append_workflows(settings, "three", 24)
        roots_cover_the_log(settings, 20, "after a member was added")
    finally:
        for proc in members.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in members.items():
            assert proc.wait(timeout=30) in (0, -signal.SIGKILL), tmp_path / f"{name}.log"

    answers: list[Covering | None] = []
    original = CheckpointView._from_directory

    def spy(self: CheckpointView, partition: int, key: bytes) -> Covering | None:
        answers.append(original(self, partition, key))
        return answers[-1]

    for partition, workflows in step_log(settings).items():
        assert workflows, f"partition {partition} holds no workflow"
        for key, records in workflows.items():
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(CheckpointView, "_from_directory", spy)
                fast = CheckpointView(settings).lookup(partition, key.decode(), fresh=False)
            whole = CheckpointView(settings).lookup(partition, key.decode(), fresh=True)
            assert fast == whole, key
            assert fast.checkpoint is not None, key
            covered = fast.checkpoint.covered_offset
            assert covered == records[-1][0], key  # the whole workflow is checkpointed
            assert list(fast.checkpoint.events) == [v for o, v in records if o <= covered], key
    assert answers and all(a is not None for a in answers), "a lookup the directory missed"
