"""The partition index proves a history whole only while it has read every offset from 0."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from stepledger.config import Settings
from stepledger.history import index as indexes
from stepledger.history.index import Lookup, PartitionIndex
from stepledger.kafka.records import Consumed, Polled, Where

WHERE = ("log", 0)


def _record(offset: int, key: bytes = b"wf") -> Consumed:
    return Consumed(WHERE[0], WHERE[1], offset, key, b"v")


def _index_from(start: int) -> PartitionIndex:
    index = PartitionIndex(Settings())
    index._began[WHERE] = start  # what _start records once the broker said the log start
    return index


def test_records_read_one_after_another_from_offset_0_keep_the_proof() -> None:
    index = _index_from(0)
    for offset in range(3):
        assert index._take(_record(offset))
    assert index._began.get(WHERE) == 0


def test_a_skipped_offset_drops_the_proof() -> None:
    index = _index_from(0)
    assert index._take(_record(0))
    assert index._take(_record(5))  # 1-4 never read: deleted under the catch-up
    assert WHERE not in index._began


def test_a_first_record_past_the_start_drops_the_proof() -> None:
    index = _index_from(0)
    assert index._take(_record(7))  # the head moved between the start and the read
    assert WHERE not in index._began


def test_a_lookup_ends_as_itself_when_another_of_the_same_key_waits() -> None:
    """Two runners of one workflow in one process look its key up at once (chaos, seed 2)."""
    index = PartitionIndex(Settings())
    waiting, mine = Lookup(WHERE, b"wf"), Lookup(WHERE, b"wf")
    waiting.done = mine.done = True  # one catch-up covered both: equal field by field
    index._lookups.append(waiting)
    index._catch_up(mine)  # registers, is done already, leaves
    assert len(index._lookups) == 1 and index._lookups[0] is waiting
    mine.first = 3  # what lookup() fills in afterwards: the two differ now
    index._lookups.remove(waiting)  # the other one's own leaving (raised ValueError before)
    assert index._lookups == []


class _Watermarks:
    """The reader's cached high watermark, as the last fetch reply left it (None: none yet)."""

    def __init__(self, high: int | None) -> None:
        self.high = high

    def high_watermark(self, where: Where) -> int | None:
        return self.high


def test_a_catch_up_ends_only_exactly_at_the_fetched_watermark() -> None:
    index = _index_from(0)
    index._one_broker = True
    for offset in range(3):
        index._take(_record(offset))  # read up to offset 2: next is 3
    for high, ends in ((5, False), (3, True), (2, False), (None, False)):
        at_end: set[tuple[str, int]] = set()
        index._reached(_Watermarks(high), {WHERE}, at_end)  # type: ignore[arg-type]
        # 5: records left to read; 2: a broker reporting short of its last record;
        # None: none known yet.
        assert (WHERE in at_end) is ends, high
    assert index.watermark_ends == 1


def test_with_several_brokers_only_the_partition_end_ends_a_catch_up() -> None:
    """A former leader's late reply may have left its older watermark in librdkafka's cache,
    even one equal to where the index is: the review's reproducer, in one step."""
    index = _index_from(0)
    for offset in range(3):
        index._take(_record(offset))
    at_end: set[tuple[str, int]] = set()
    index._reached(_Watermarks(3), {WHERE}, at_end)  # type: ignore[arg-type]
    assert at_end == set() and index.watermark_ends == 0


def test_the_index_and_point_readers_read_from_leaders_even_with_a_client_rack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``-X client.rack`` a consumer may fetch from a follower, whose end lags records
    the leader acknowledged: a read "to the end" would miss them."""
    from confluent_kafka import KafkaError, KafkaException

    from stepledger.checkpoints.view import CheckpointView
    from stepledger.kafka import consumer as consumers

    made: list[dict[str, object]] = []

    class Recorded:
        def __init__(self, conf: dict[str, object]) -> None:
            made.append(conf)

        def list_topics(self, *args: object, **kwargs: object) -> object:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

        get_watermark_offsets = list_topics  # no broker here: the start is offset 0

        def assign(self, parts: object) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(consumers, "Consumer", Recorded)
    settings = Settings(kafka={"client.rack": "rack-1"})
    PartitionIndex(settings)._assigned({WHERE}, True)
    with CheckpointView(settings)._points(0) as points:
        points.reader.brokers("log")  # the point reader's client is made on first use
    assert [conf["client.rack"] for conf in made] == ["", ""]


_End = tuple[Where, int]
"""A partition end the tail fetched: (partition, its offset)."""


class _Tail:
    """A partition reader already assigned: it hands out what it fetched, oldest first."""

    fetch_wait_ms = indexes.FIRST_FETCH_WAIT_MS

    def __init__(self, *queued: Consumed | _End) -> None:
        self.queued = list(queued)
        self.assigned: list[object] = []

    def poll(self, limit: int, wait_s: float = 0.0, *, prompt: bool = False) -> Polled:
        taken, self.queued = self.queued[:limit], self.queued[limit:]
        records = [item for item in taken if isinstance(item, Consumed)]
        ends = dict(item for item in taken if not isinstance(item, Consumed))
        return Polled(records, ends, bool(taken))

    def high_watermark(self, where: Where) -> int | None:
        return None  # not known yet: the reaper keeps the tail

    def assign(self, starts: Mapping[Where, int]) -> None:
        self.assigned.append(starts)

    def unassign(self) -> None:
        self.assigned.append(None)

    def grow(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _tailed(*queued: Consumed | _End) -> tuple[PartitionIndex, _Tail]:
    index = _index_from(0)
    tail = _Tail(*queued)
    index._reader, index._tailing = tail, {WHERE}  # type: ignore[assignment]
    index._current = {WHERE}  # a catch-up completed since the assignment
    index._next[WHERE] = 0  # tailed from offset 0: nothing read yet
    return index, tail


def _eof(offset: int) -> _End:
    return (WHERE, offset)


def test_a_bounded_lookup_reads_the_tail_through_its_bound_and_assigns_nothing() -> None:
    # An end fetched before the lookup (offset 1) must not end it: record 3 is the bound.
    index, tail = _tailed(_record(0, b"x"), _eof(1), _record(1, b"x"), _record(2), _record(3))
    found = index.lookup(WHERE, b"wf", through=3)
    assert tail.assigned == [] and index.assignments == 0
    assert index._next[WHERE] == 4
    assert found.first == 2 and [v for v, _ in found.records] == [b"v", b"v"] and found.complete


def test_a_bound_the_tail_passed_already_reads_nothing() -> None:
    index, tail = _tailed(_record(0), _record(1, b"later"))
    index.lookup(WHERE, b"wf", through=0)
    left = list(tail.queued)
    assert index.lookup(WHERE, b"wf", through=0).first == 0
    assert tail.queued == left  # nothing consumed for the second lookup


def test_an_unbounded_lookup_assigns_afresh_and_ignores_what_the_tail_fetched_before() -> None:
    index, tail = _tailed(_eof(0))

    def fresh(parts: object) -> None:
        tail.assigned.append(parts)
        tail.queued = [_record(0), _eof(1)]  # librdkafka drops what was fetched before

    tail.assign = fresh  # type: ignore[method-assign,assignment]
    found = index.lookup(WHERE, b"wf")
    assert tail.assigned[0] is None and index.assignments == 1  # unassigned, then assigned
    assert found.first == 0


def test_unseen_needs_a_tail_read_from_offset_0_that_never_saw_the_key() -> None:
    index, _ = _tailed(_record(0, b"known"))
    index.lookup(WHERE, b"known", through=0)
    assert index.unseen(WHERE, b"new") and not index.unseen(WHERE, b"known")
    index._began.pop(WHERE)  # a skipped offset: the proof from offset 0 is gone
    assert not index.unseen(WHERE, b"new")
    index._began[WHERE] = 0
    index._current = set()  # unassigned, or mid-read: the index does not know the ids below
    assert not index.unseen(WHERE, b"new")


def test_mid_read_the_index_answers_no_id_as_unseen() -> None:
    """Assigned but not caught up, the index does not know the ids below the partition's end
    (the bench's asyncio agents opened ids started before the first catch-up ended)."""
    index, tail = _tailed()
    index._current = set()
    tail.assign = lambda parts: tail.queued.extend([_record(0, b"old"), _eof(1)])  # type: ignore[method-assign,assignment]
    index._assigned({WHERE}, True)  # a catch-up's fresh assignment: tailed, not read yet
    assert WHERE in index.tailing and not index.unseen(WHERE, b"old")
    index.lookup(WHERE, b"other")  # the catch-up completes: the index knows what is below
    assert not index.unseen(WHERE, b"old") and index.unseen(WHERE, b"new")


def test_the_snapshot_reader_opts_out_of_reads_through_own_records(tmp_path: object) -> None:
    """Its opens read first: the snapshot, not the index, knows which ids the log holds; a
    deprecated Kafka reader name stands for the Kafka history itself."""
    from stepledger.history.adapt import as_history
    from stepledger.history.kafka import KafkaHistory
    from stepledger.history.legacy import KafkaPartitionReader, SnapshotTailReader

    settings = Settings()
    with pytest.warns(DeprecationWarning):
        assert isinstance(as_history(KafkaPartitionReader(settings)), KafkaHistory)
    snapshot = as_history(SnapshotTailReader(settings, str(tmp_path)))
    assert snapshot.known("wf") is None


def test_past_max_notes_a_partition_answers_no_id_unseen(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepledger.history import index as indexes

    monkeypatch.setattr(indexes, "MAX_NOTES", 2)
    index, _ = _tailed()
    index.wrote(WHERE, b"a", 0)
    index.wrote(WHERE, b"b", 1)
    assert index.unseen(WHERE, b"new") and not index.unseen(WHERE, b"a")
    index.wrote(WHERE, b"c", 2)  # a third note not read yet: the notes no longer fit
    assert WHERE not in index._began and not index.unseen(WHERE, b"new")
    assert index.tailed(WHERE, b"a") is None


def test_a_history_longer_than_max_tailed_is_not_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepledger.history import index as indexes

    monkeypatch.setattr(indexes, "MAX_TAILED", 2)
    index, _ = _tailed(_record(0), _record(1), _record(2, b"short"), _record(3, b"short"))
    index.lookup(WHERE, b"wf", through=3)
    assert index.tailed(WHERE, b"short") == [b"v", b"v"]
    assert index.tailed(WHERE, b"wf") == [b"v", b"v"]
    index._reader.queued = [_record(4)]  # type: ignore[union-attr]
    index.lookup(WHERE, b"wf", through=4)  # a third record of wf: too long to hand out
    assert index.tailed(WHERE, b"wf") is None and index.tailed(WHERE, b"short") is not None


class _CachedEnd:
    """A reader whose last fetch reported this end (None before any)."""

    def __init__(self, high: int | None) -> None:
        self.high = high

    def high_watermark(self, where: Where) -> int | None:
        return self.high


@pytest.mark.parametrize(
    ("high", "read_to", "began", "ahead"),
    [
        (None, 10, None, False),  # no fetch reported an end yet: says nothing
        (10 + indexes.TAIL_AHEAD_RECORDS, 10, None, False),  # exactly at the bound: kept
        (11 + indexes.TAIL_AHEAD_RECORDS, 10, None, True),  # one past it
        (5 + indexes.TAIL_AHEAD_RECORDS, None, 0, True),  # read nothing: from where it began
        (10**6, None, None, False),  # neither known: says nothing
        (2**63 - 1, 2**63 - 2, None, False),  # at the top of Kafka's offsets
    ],
)
def test_the_tail_runs_ahead_only_past_the_bound_from_what_is_known(
    high: int | None, read_to: int | None, began: int | None, ahead: bool
) -> None:
    index = PartitionIndex(Settings())
    index._reader = _CachedEnd(high)  # type: ignore[assignment]
    index._tailing = {WHERE}
    if read_to is not None:
        index._next[WHERE] = read_to
    if began is not None:
        index._began[WHERE] = began
    assert index._ran_ahead() is ahead
