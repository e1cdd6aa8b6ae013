"""The Apache Kafka test cluster's id: never one kafka-storage reads as an option."""

from __future__ import annotations

from stepledger_dev.apache_kafka.cluster import _cluster_id


def test_cluster_ids_never_start_with_a_dash() -> None:
    # One plain draw in 64 starts with "-" (it once failed `chaos --engine kafka` with
    # "argument --cluster-id/-t: expected one argument"); 2,000 draws would meet it.
    drawn = [_cluster_id() for _ in range(2000)]
    assert not [c for c in drawn if c.startswith("-")]
    assert len(set(drawn)) == 2000 and all(len(c) == 22 for c in drawn)
