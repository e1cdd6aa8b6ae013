"""The checkpoint directory: finding one workflow's checkpoint without reading its partition.

Kafka looks records up by offset, never by key, and a compacted topic keeps one checkpoint
per workflow for as long as the workflow exists: a reader that wants one checkpoint would
read every checkpoint of the partition (15k checkpoints, 65 MB, ~0.5 s for a 1M-event
log).  The checkpointer therefore also writes, per partition, where each workflow's newest
checkpoint sits:

- **chunks**, one per *bucket* of workflow-id hashes (the hash's top bits), each a sorted
  array of (BLAKE2b-64 of the workflow id, checkpoint-topic offset) pairs, 16 bytes each;
- a **root** listing each bucket's chunk offset and the *progress* the directory vouches
  for: every workflow with a step-log record at or below it has an entry, and the entry's
  checkpoint covers those records (written only after every listed checkpoint was
  acknowledged, as the progress record is);
- on **every** record it writes, the header ``stepledger_directory``: the newest root's
  offset it knows.

A reader then needs the partition's last record (its header names the root, or it is the
root), the root, one chunk, the records after the root (checkpoints written since) and
the entry's checkpoint: a handful of fetches, whatever the partition holds.  Whatever it
cannot prove (no header, a record compacted away, a hash collision, a tombstone) sends
the reader back to reading the partition: the directory only ever makes a lookup faster.

This module is the pure part (hashing, the record and its codec); the reads are in
:mod:`stepledger.checkpoints.view` and the writes in :mod:`stepledger.checkpoints.writer`.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from stepledger import wire
from stepledger.codec import read_record, write_record
from stepledger.errors import CodecError

NAME = "stepledger.CheckpointDirectory"
#: The root's record key (no workflow id starts with a NUL byte).
ROOT_KEY = wire.CHECKPOINT_DIRECTORY_KEY.encode()
#: A chunk's key is this prefix and its bucket number in decimal.
CHUNK_PREFIX = wire.CHECKPOINT_DIRECTORY_CHUNK_PREFIX.encode()
#: At most this many entries per chunk (16 bytes each: 128 KiB, well inside a record).
CHUNK_ENTRIES = 8192
_ENTRY = struct.Struct(">QQ")
_INT_MAX = 2**31 - 1


def key_hash(key: bytes) -> int:
    """The 64-bit hash a workflow id is listed under."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def bucket_count(workflows: int) -> int:
    """How many buckets a directory of ``workflows`` entries is split into (a power of two)."""
    buckets = 1
    while buckets * CHUNK_ENTRIES < workflows:
        buckets *= 2
    return buckets


def bucket_of(hashed: int, buckets: int) -> int:
    """The bucket of a hash: its top bits (``buckets`` is a power of two)."""
    return hashed >> (64 - (buckets.bit_length() - 1)) if buckets > 1 else 0


def chunk_key(bucket: int) -> bytes:
    """The record key of a bucket's chunk."""
    return CHUNK_PREFIX + str(bucket).encode()


def is_directory_key(key: bytes) -> bool:
    """True for the root's and the chunks' keys (never a workflow's)."""
    return key == ROOT_KEY or key.startswith(CHUNK_PREFIX)


@dataclass(frozen=True)
class DirectoryRecord:
    """A root (``bucket == -1``) or one bucket's chunk."""

    topic: str
    partition: int
    progress: int
    bucket: int
    buckets: int
    chunks: tuple[int, ...] = ()
    entries: bytes = b""

    @property
    def key(self) -> bytes:
        """The record key: the root's, or the chunk's for its bucket."""
        return ROOT_KEY if self.bucket < 0 else chunk_key(self.bucket)

    def offsets_of(self, hashed: int) -> list[int]:
        """A chunk's checkpoint offsets listed under a hash (several only on a collision)."""
        count = len(self.entries) // _ENTRY.size
        hashes = _HashColumn(self.entries, count)
        at = bisect.bisect_left(hashes, hashed)
        found = []
        while at < count:
            listed, offset = _ENTRY.unpack_from(self.entries, at * _ENTRY.size)
            if listed != hashed:
                break
            found.append(offset)
            at += 1
        return found


@dataclass(frozen=True)
class _HashColumn:
    """The hashes of packed entries as a sequence ``bisect`` can search without copying."""

    entries: bytes
    count: int

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        return cast(int, _ENTRY.unpack_from(self.entries, index * _ENTRY.size)[0])


@dataclass
class Directory:
    """The checkpointer's side: each workflow's newest checkpoint offset, by bucket."""

    offsets: dict[bytes, int] = field(default_factory=dict)
    """Key -> checkpoint-topic offset of its newest acknowledged checkpoint."""
    changed: set[bytes] = field(default_factory=set)
    """Keys whose offset changed since the directory was last written."""
    buckets: int = 0
    """The bucket count of the chunks last written (0: none written yet)."""
    chunks: list[int] = field(default_factory=list)
    """The offset of each bucket's chunk last written."""
    root: int = -1
    """The offset of the newest root acknowledged (-1: none yet)."""

    def put(self, key: bytes, offset: int) -> None:
        """Record where ``key``'s newest checkpoint is."""
        if self.offsets.get(key) != offset:
            self.offsets[key] = offset
            self.changed.add(key)

    def due(self) -> bool:
        """True when a directory should be written (something changed, or none exists)."""
        return bool(self.changed) or (self.root < 0 and bool(self.offsets))

    def chunks_due(self, topic: str, partition: int, progress: int) -> list[DirectoryRecord]:
        """The chunks to write now: every bucket whose entries changed (all of them when
        the bucket count changed)."""
        buckets = bucket_count(len(self.offsets))
        if buckets != self.buckets or len(self.chunks) != buckets:
            dirty = set(range(buckets))
        else:
            dirty = {bucket_of(key_hash(key), buckets) for key in self.changed}
        members: dict[int, list[tuple[int, int]]] = {b: [] for b in dirty}
        for key, offset in self.offsets.items():
            hashed = key_hash(key)
            bucket = bucket_of(hashed, buckets)
            if bucket in members:
                members[bucket].append((hashed, offset))
        return [
            DirectoryRecord(topic, partition, progress, b, buckets, (), pack(members[b]))
            for b in sorted(dirty)
        ]

    def written(self, chunks: Mapping[int, int], buckets: int) -> None:
        """Chunks acknowledged at the given offsets (bucket -> offset)."""
        if buckets != self.buckets or len(self.chunks) != buckets:
            self.chunks = [-1] * buckets
            self.buckets = buckets
        for bucket, offset in chunks.items():
            self.chunks[bucket] = offset
        self.changed.clear()

    def root_record(self, topic: str, partition: int, progress: int) -> DirectoryRecord:
        """The root over the chunks written so far."""
        return DirectoryRecord(topic, partition, progress, -1, self.buckets, tuple(self.chunks))


def pack(entries: Iterable[tuple[int, int]]) -> bytes:
    """Sorted (hash, offset) pairs, packed 16 bytes each."""
    return b"".join(_ENTRY.pack(h, o) for h, o in sorted(entries))


def encode(record: DirectoryRecord) -> bytes:
    """The framed Avro bytes of a directory record (bounded ints are checked first)."""
    for name in ("partition", "buckets"):
        value = getattr(record, name)
        if not 0 <= value <= _INT_MAX:
            raise CodecError(f"directory {name}={value} does not fit an Avro int")
    if not -1 <= record.bucket <= _INT_MAX:
        raise CodecError(f"directory bucket={record.bucket} does not fit")
    return write_record(
        NAME,
        {
            "topic": record.topic,
            "partition": record.partition,
            "progress": record.progress,
            "bucket": record.bucket,
            "buckets": record.buckets,
            "chunks": list(record.chunks),
            "entries": record.entries,
        },
    )


def decode(data: bytes | None) -> DirectoryRecord:
    """The directory record in framed bytes; anything else raises CodecError."""
    r = read_record(NAME, data, "checkpoint directory")
    entries = bytes(r["entries"])
    if len(entries) % _ENTRY.size:
        raise CodecError("undecodable checkpoint directory: entries are not 16-byte pairs")
    buckets = r["buckets"]
    if buckets < 1 or buckets & (buckets - 1):
        raise CodecError(f"undecodable checkpoint directory: {buckets} buckets")
    return DirectoryRecord(
        r["topic"], r["partition"], r["progress"], r["bucket"], buckets, tuple(r["chunks"]), entries
    )


def root_pointer(
    headers: Mapping[str, str | bytes | None] | Iterable[tuple[str, str | bytes | None]] | None,
) -> int | None:
    """The root offset a record's ``stepledger_directory`` header names (None: none)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == wire.CHECKPOINT_DIRECTORY_HEADER and value:
            try:
                offset = int(value if isinstance(value, str) else value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                return None
            return offset if offset >= 0 else None
    return None
