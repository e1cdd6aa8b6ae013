"""The set of workflows the store may hold: never less than the store, so reads are skipped only
for workflows the store cannot hold."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stepledger.deadletters.records import MemoryRecordLetters
from stepledger.projector.engine import Projector
from stepledger.projector.known import StoredWorkflows
from stepledger.projector.store import ProjectionStore
from tests.unit.projector_harness import CODEC, batches, project, table_contents, to_messages
from tests.unit.projector_logs import random_log


def test_what_was_added_is_held_and_growth_keeps_it() -> None:
    stored = StoredWorkflows()
    stored.build(0, lambda take: take(["a", "b"]))
    ids = [f"wf-{i}" for i in range(200_000)]  # past the first table: it grows twice
    stored.add(ids)
    assert stored.may_hold(["a", "b", *ids]) == ["a", "b", *ids]
    others = [f"other-{i}" for i in range(10_000)]
    assert len(stored.may_hold(others)) <= 1  # a 64-bit fingerprint collision at most


def test_past_its_limit_the_set_is_dropped_and_everything_may_be_held() -> None:
    stored = StoredWorkflows(max_slots=1 << 16)
    stored.build(0, lambda take: None)
    stored.add(f"wf-{i}" for i in range(60_000))
    assert not stored.enabled and stored.built
    assert stored.may_hold(["new"]) == ["new"]
    big = StoredWorkflows(max_slots=1 << 16)
    big.build(100_000, lambda take: take(["a"]))
    assert not big.enabled and big.may_hold(["new"]) == ["new"]


class CountingStore(ProjectionStore):
    """A store that counts the reads asking which workflows it holds."""

    asked = 0

    def known_workflows(self, workflow_ids: list[str]) -> set[str]:
        self.asked += 1
        return super().known_workflows(workflow_ids)


def test_new_workflows_are_folded_without_asking_the_store(tmp_path: Path) -> None:
    messages = to_messages(random_log(seed=21, workflows=40))
    store = CountingStore(tmp_path / "p.duckdb")
    with store:
        projector = Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=1000)
        for batch in batches(messages, random.Random(1), 30):
            projector.process(batch)
    assert store.asked == 0


@pytest.mark.parametrize("cache", [1, 3])
def test_stored_workflows_are_still_replayed_after_eviction_and_restart(
    tmp_path: Path, cache: int
) -> None:
    # Workflows leave a small cache and come back, and a second projector (a restart)
    # continues the file: their stored events must be replayed, as a single pass gives.
    messages = to_messages(random_log(seed=22, workflows=25))
    half = len(messages) // 2
    split, whole = tmp_path / "split.duckdb", tmp_path / "whole.duckdb"
    project(split, messages[:half], cache=cache)
    store = CountingStore(split)
    with store:
        projector = Projector(store, CODEC, MemoryRecordLetters(), cache_workflows=cache)
        for batch in batches(messages[half:], random.Random(2), 20):
            projector.process(batch)
    assert store.asked > 0
    project(whole, messages, cache=1000, largest_batch=len(messages))
    assert table_contents(split) == table_contents(whole)
