"""The checkpoint directory's pure part: buckets, packed entries, the record and its codec."""

from __future__ import annotations

import pytest

from stepledger import wire
from stepledger.checkpoints import directory as dirs
from stepledger.checkpoints.directory import Directory, DirectoryRecord
from stepledger.errors import CodecError


def test_bucket_counts_are_powers_of_two_that_keep_chunks_within_their_size() -> None:
    assert dirs.bucket_count(0) == dirs.bucket_count(dirs.CHUNK_ENTRIES) == 1
    assert dirs.bucket_count(dirs.CHUNK_ENTRIES + 1) == 2
    assert dirs.bucket_count(100 * dirs.CHUNK_ENTRIES) == 128
    for buckets in (1, 2, 8, 1024):
        seen = {dirs.bucket_of(dirs.key_hash(f"wf-{i}".encode()), buckets) for i in range(4000)}
        assert seen == set(range(buckets)) or buckets > 1000
        assert all(0 <= b < buckets for b in seen)


def test_a_chunk_finds_every_listed_hash_and_each_collision_twice() -> None:
    entries = [(dirs.key_hash(f"wf-{i}".encode()), 10 * i) for i in range(500)]
    colliding = entries[7][0]
    record = DirectoryRecord("t", 0, 99, 0, 1, (), dirs.pack([*entries, (colliding, 9999)]))
    for hashed, offset in entries[:50]:
        assert offset in record.offsets_of(hashed)
    assert sorted(record.offsets_of(colliding)) == [70, 9999]
    assert record.offsets_of(dirs.key_hash(b"not-listed")) == []


def test_records_round_trip_and_garbage_is_refused_with_codec_error() -> None:
    chunk = DirectoryRecord("events", 2, 41, 3, 4, (), dirs.pack([(5, 6), (1, 2)]))
    root = DirectoryRecord("events", 2, 41, -1, 4, (10, 11, 12, 13))
    assert dirs.decode(dirs.encode(chunk)) == chunk
    assert dirs.decode(dirs.encode(root)) == root
    assert root.key == dirs.ROOT_KEY and chunk.key == dirs.chunk_key(3)
    assert dirs.is_directory_key(root.key) and dirs.is_directory_key(chunk.key)
    assert not dirs.is_directory_key(b"wf-1")
    for bad in (None, b"", b"\xc3\x01" + b"\x00" * 8, dirs.encode(root)[:-3]):
        with pytest.raises(CodecError):
            dirs.decode(bad)
    odd = DirectoryRecord("events", 2, 41, 0, 1, (), b"\x00" * 15)
    with pytest.raises(CodecError, match="16-byte"):
        dirs.decode(dirs.encode(odd))
    with pytest.raises(CodecError, match="buckets"):
        dirs.decode(dirs.encode(DirectoryRecord("events", 2, 41, -1, 3, (1, 2, 3))))


def test_the_root_pointer_header_is_read_from_either_header_shape() -> None:
    name = wire.CHECKPOINT_DIRECTORY_HEADER
    assert dirs.root_pointer([(name, b"17")]) == 17
    assert dirs.root_pointer({name: "17"}) == 17
    assert dirs.root_pointer([("ce_type", b"x")]) is None
    assert dirs.root_pointer(None) is None
    assert dirs.root_pointer([(name, b"-1")]) is None
    assert dirs.root_pointer([(name, b"\xff")]) is None


def test_only_changed_buckets_are_rewritten_until_the_bucket_count_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dirs, "CHUNK_ENTRIES", 4)
    directory = Directory()
    assert not directory.due()
    for i in range(8):
        directory.put(f"wf-{i}".encode(), i)
    assert directory.due()
    first = directory.chunks_due("t", 0, 7)
    assert [c.bucket for c in first] == [0, 1] and {c.buckets for c in first} == {2}
    directory.written({c.bucket: 100 + c.bucket for c in first}, 2)
    assert directory.due()  # no root yet
    directory.root = 102
    assert not directory.due()
    listed = {o for c in first for o in _offsets(c)}
    assert listed == set(range(8))

    directory.put(b"wf-3", 3)  # the same offset: nothing changed
    assert not directory.due()
    directory.put(b"wf-3", 50)
    again = directory.chunks_due("t", 0, 8)
    assert len(again) == 1 and 50 in _offsets(again[0]) and 3 not in _offsets(again[0])
    directory.written({again[0].bucket: 200}, 2)
    root = directory.root_record("t", 0, 8)
    assert root.bucket == -1 and root.buckets == 2 and 200 in root.chunks

    directory.put(b"wf-new", 60)  # 9 entries: 4 buckets, every chunk rewritten
    grown = directory.chunks_due("t", 0, 9)
    assert [c.bucket for c in grown] == [0, 1, 2, 3]
    assert {o for c in grown for o in _offsets(c)} == set(range(8)) - {3} | {50, 60}


def _offsets(chunk: DirectoryRecord) -> set[int]:
    return {
        int.from_bytes(chunk.entries[i + 8 : i + 16], "big")
        for i in range(0, len(chunk.entries), 16)
    }
