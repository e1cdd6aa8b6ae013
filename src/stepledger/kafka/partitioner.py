"""Which partition a workflow's events land in, computed as the producer computes it.

Every event is keyed by its workflow id, so one workflow lives in one partition (DESIGN
invariant 3).  A reader that knows that partition reads it alone instead of the whole
topic.  The partition is what the producer's partitioner chose, so it is computed with the
same function, from the same ``partitioner`` setting the producers run with:

- ``consistent_random`` (librdkafka's default, which stepledger's producers use unless an
  operator sets ``-X partitioner=...``) and ``consistent``: CRC-32 of the key, modulo the
  partition count;
- ``murmur2_random`` and ``murmur2`` (the Java client's default): Kafka's murmur2 of the
  key, made positive, modulo the partition count.

Any other partitioner (``random``, ``fnv1a``...) gives ``None``: the reader then scans
every partition, as before.  ``tests/integration/test_partition_reader.py`` checks the
computed partition against where the broker actually put each record.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

#: librdkafka's default partitioner (``partitioner`` unset).
DEFAULT = "consistent_random"
_CRC32 = frozenset({"consistent_random", "consistent"})
_MURMUR2 = frozenset({"murmur2_random", "murmur2"})


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``), 32-bit unsigned."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_of(key: bytes, partitions: int, partitioner: str = DEFAULT) -> int | None:
    """The partition a keyed record lands in; None when the partitioner is not deterministic."""
    if partitions <= 0 or not key:
        return None
    if partitioner in _CRC32:
        return zlib.crc32(key) % partitions
    if partitioner in _MURMUR2:
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    return None


def configured(config: Mapping[str, Any]) -> str:
    """The partitioner a librdkafka config selects (its default when unset)."""
    return str(config.get("partitioner", DEFAULT))
