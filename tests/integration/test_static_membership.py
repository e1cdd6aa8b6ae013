"""Static membership of projectors (``--instance-id``): restarts move nothing, duplicates stop.

Each projector logs ``assigned t[p]@o, ...`` and ``revoked t[p], ...`` on every change of
its assignment, so a member's log tells exactly which partitions it owned when.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from tests.conftest import Factory
from tests.integration.projector_helpers import (
    produce_events,
    projected,
    projector_command,
    wait_for,
)
from tests.unit.projector_logs import random_log

PARTITIONS = 4
_CHANGE = re.compile(r" (assigned|revoked) (.+)$")
_PART = re.compile(r"\[(\d+)\]")
PROTOCOLS = [
    pytest.param("classic"),
    # KIP-848 exists on Apache Kafka 4.x only (the dev broker has no such groups).
    pytest.param("consumer", marks=pytest.mark.kafka_only),
]


class Member:
    """A ``stepledger project`` process and its log."""

    def __init__(
        self, settings: Settings, shards: Path, log: Path, instance: str, protocol: str
    ) -> None:
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                projector_command(
                    settings,
                    shards,
                    *("--session-timeout", "30", "--snapshot-interval", "0.3"),
                    *("--instance-id", instance, "--group-protocol", protocol),
                ),
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
            )

    def changes(self) -> list[tuple[str, frozenset[int]]]:
        """Every assignment change so far, in order."""
        found = []
        for line in self.log.read_text().splitlines():
            match = _CHANGE.search(line)
            if match:
                parts = frozenset(int(p) for p in _PART.findall(match.group(2)))
                found.append((match.group(1), parts))
        return found

    def owned(self) -> frozenset[int]:
        """The partitions its log says it owns now."""
        owned: set[int] = set()
        for kind, parts in self.changes():
            owned = owned | parts if kind == "assigned" else owned - parts
        return frozenset(owned)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait (bounded)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in started:
        if member.proc.poll() is None:
            member.proc.kill()
            member.proc.wait(30)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_static_member_restarted_within_its_session_gets_its_partitions_back_alone(
    protocol: str, make_settings: Factory, tmp_path: Path, members: list[Member]
) -> None:
    settings = make_settings(partitions=PARTITIONS)
    shards = tmp_path / "shards"

    def start(name: str, run: int) -> Member:
        member = Member(settings, shards, tmp_path / f"{name}-{run}.log", name, protocol)
        members.append(member)
        return member

    a, b = start("a", 1), start("b", 1)
    wait_for(
        lambda: a.owned() and b.owned() and len(a.owned() | b.owned()) == PARTITIONS,
        90,
        "both members to share the partitions",
    )
    before_a, before_b, b_changes = a.owned(), b.owned(), len(b.changes())
    assert not before_a & before_b
    assert a.stop() == 0
    again = start("a", 2)
    wait_for(again.owned, 60, "the restarted member's assignment")
    assert again.owned() == before_a
    assert b.changes()[b_changes:] == [], "the other member's assignment changed"
    assert b.owned() == before_b
    assert b.proc.poll() is None and again.proc.poll() is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_two_processes_with_one_instance_id_one_stops_in_one_line_the_other_projects_all(
    protocol: str, make_settings: Factory, tmp_path: Path, members: list[Member]
) -> None:
    settings = make_settings(partitions=PARTITIONS)
    shards = tmp_path / "shards"
    first = Member(settings, shards, tmp_path / "first.log", "same", protocol)
    members.append(first)
    wait_for(lambda: len(first.owned()) == PARTITIONS, 90, "the first member's assignment")
    second = Member(settings, shards, tmp_path / "second.log", "same", protocol)
    members.append(second)
    began = time.monotonic()
    wait_for(
        lambda: first.proc.poll() is not None or second.proc.poll() is not None,
        60,
        "one of the two to stop",
    )
    stopped_after = time.monotonic() - began
    gone, kept = (first, second) if first.proc.poll() is not None else (second, first)
    # Classic groups fence the older member; KIP-848 refuses the newcomer.
    assert gone is (first if protocol == "classic" else second), gone.log.read_text()
    assert gone.proc.returncode == 1
    stderr = gone.log.read_text()
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "instance" in errors[0], stderr
    events = random_log(seed=12, workflows=30)
    produce_events(settings, events)
    wait_for(lambda: projected(shards) == len(events), 90, "the survivor to project every event")
    assert len(kept.owned()) == PARTITIONS
    assert kept.stop() == 0
    assert stopped_after < 30
