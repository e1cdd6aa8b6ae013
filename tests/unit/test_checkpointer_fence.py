"""A checkpointer in a group writes only for partitions its fence says it owns (and the group,
not a fixed list, gives it partitions).

A member paused past its session (its partitions moved) wakes with a round due: it must
write nothing for them (no checkpoint, no directory root over the new owner's) until the
group has answered, and nothing at all for a partition it lost.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from stepledger.checkpoints.writer import Checkpointer, _Partition
from stepledger.cli import cli
from stepledger.cli._common import run_guarded
from stepledger.config import Settings
from stepledger.kafka.fence import Fence
from stepledger.kafka.logid import LogIdentity
from stepledger.kafka.producer import Headers, Position
from stepledger.kafka.records import Consumed


class _Producer:
    """Acknowledges every record at the next offset and remembers its key."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: Headers, *, partition: int
    ) -> Future[Position]:
        self.keys.append(key)
        done: Future[Position] = Future()
        done.set_result(Position(topic, partition, len(self.keys) - 1))
        return done

    def wait(self, future: Future[Position]) -> Position:
        return future.result()

    def close(self) -> None:
        """Nothing to flush."""


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(offset: int) -> Consumed:
    return Consumed("log", 0, offset, b"wf-1", b"a value the codec skips")


def member() -> tuple[Checkpointer, _Producer, Fence, _Clock]:
    settings = Settings(bootstrap="127.0.0.1:9", topic="log")
    checkpointer = Checkpointer(settings, identity=LogIdentity("log", "id"))
    producer = _Producer()
    checkpointer._producer = producer  # type: ignore[assignment]
    clock = _Clock()
    fence = Fence(session_s=2.0, heartbeat_s=0.2, clock=clock)
    checkpointer.fence = fence
    checkpointer._parts[0] = _Partition(0)
    fence.assigned({0})
    fence.polled()
    return checkpointer, producer, fence, clock


def test_a_member_back_from_a_pause_writes_nothing_until_the_group_answered() -> None:
    checkpointer, producer, fence, clock = member()
    checkpointer.take(_record(0))
    checkpointer.round()
    assert producer.keys, "an owner writes its round"
    written = len(producer.keys)

    checkpointer.take(_record(1))
    clock.now += 10.0  # paused past the session: the partition may have moved
    checkpointer.round()
    assert len(producer.keys) == written  # no checkpoint, no root over the new owner's
    fence.polled()  # back: the group has not answered yet
    checkpointer.round()
    assert len(producer.keys) == written
    clock.now += 1.0
    fence.polled()  # the group kept the partition here: the round is written then
    checkpointer.round()
    assert len(producer.keys) > written
    checkpointer.close()


def test_a_lost_partition_is_forgotten_unwritten_and_a_revoked_one_gets_a_last_round() -> None:
    checkpointer, producer, fence, _ = member()
    checkpointer.take(_record(0))
    fence.revoked({0})
    checkpointer.drop([0])
    assert producer.keys == [] and checkpointer.partitions == []
    checkpointer.take(_record(1))  # in flight when it was lost: ignored
    assert producer.keys == []

    checkpointer._parts[0] = _Partition(0)
    fence.assigned({0})
    checkpointer.take(_record(0))  # given back: read again from its progress
    checkpointer.release([0])  # revoked: still ours while the callback runs
    assert b"wf-1" in producer.keys and checkpointer.partitions == []
    checkpointer.close()


def test_a_fixed_partition_list_is_refused_in_one_line_naming_the_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["stepledger", "checkpoint", "--bootstrap", "127.0.0.1:9", "--topic", "orders"]
    monkeypatch.setattr("sys.argv", [*argv, "--partitions", "0,1"])
    assert run_guarded(cli) == 1  # before any broker is asked
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--partitions is gone" in err
    assert "orders.checkpointer" in err
