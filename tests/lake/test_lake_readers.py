"""The inbox and the CLI read the lake when configured (``Settings.lake``, ``--lake``).

One reader serves both: the queue reads the lake's tables instead of a snapshot file, and
the history reader takes a workflow's head from the lake (events and offsets at one lake
snapshot) and reads its partition's tail after it.  Real PostgreSQL, moto's S3, the test
broker, ``stepledger inbox`` as a real process answering HTTP.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from stepledger.cli._runtime import reader_for
from stepledger.config import Settings
from stepledger.history.kafka import KafkaHistory
from stepledger.humanqueue import queue as q
from stepledger.readers.lake import LakeConfig, LakeSource, configured_lake
from stepledger_dev.broker import free_port
from stepledger_dev.lake_stack import LakeStack
from tests.integration import inbox_helpers as h
from tests.integration.projector_helpers import produce_events, projecting

TOKEN = "lake-inbox-token-" + "x" * 16


def _cases(settings: Settings, lake: LakeConfig, tmp_path: Path) -> int:
    old, new = h.factory("fleet-a", hours_ago=3), h.factory("fleet-b", hours_ago=0.01)
    events = [
        *h.escalated_wire(old, "trip-old", "esc-old"),
        *h.escalated_lookup(new, "pay-new", "esc-new"),
        *h.pending_approval(new, "trip-approve"),
    ]
    sent = produce_events(settings, events)
    with projecting(settings, tmp_path / "unused.duckdb", lake=lake) as daemon:
        daemon.wait_received(sent)
    return sent


def _get(url: str) -> tuple[int, str] | None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def test_the_inbox_process_serves_its_queue_and_cases_from_the_lake(
    settings: Settings, stack: LakeStack, lake: LakeConfig, tmp_path: Path
) -> None:
    _cases(settings, lake, tmp_path)
    port = free_port()
    env = {
        **os.environ,
        **stack.env(),
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        "STEPLEDGER_INBOX_TOKEN": TOKEN,
    }
    # --db names no file: only the lake holds the projection.
    argv = [sys.executable, "-m", "stepledger", "inbox", "--db", "absent.duckdb"]
    argv += ["--lake", lake.catalog, "--port", str(port)]
    process = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        answer = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[1][-2000:]
            answer = _get(f"http://127.0.0.1:{port}/")
            if answer is not None and answer[0] == 200 and "trip-old" in answer[1]:
                break
            time.sleep(0.2)
        assert answer is not None and answer[0] == 200, answer
        page = answer[1]
        assert "trip-old" in page and "pay-new" in page and "trip-approve" in page, page[-3000:]
        assert "no projection to read yet" not in page
        case = _get(f"http://127.0.0.1:{port}/escalations/esc-old")
        assert case is not None and case[0] == 200, case
        assert "trip-old" in case[1]
    finally:
        process.terminate()
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def test_the_queue_and_the_history_reader_read_the_lake_they_are_configured_with(
    settings: Settings, lake: LakeConfig, tmp_path: Path
) -> None:
    _cases(settings, lake, tmp_path)
    configured = Settings(**{**settings.model_dump(), "lake": lake.catalog})
    source = configured_lake(configured.lake, configured.topic)
    assert source == LakeSource(lake.__class__.from_env(lake.catalog), settings.topic)
    queue = q.QueueSource(source)
    try:
        first = queue.version()
        assert first.startswith("lake-")
        page = queue.page(q.QueueFilter())
        assert page.total == 3 and page.source == str(source)
        assert queue.workflow_of("esc-new") == "pay-new"
    finally:
        queue.close()
    # The head from the lake (its offsets), then the partition's tail: one new event there.
    more = h.pending_approval(h.factory("fleet-a"), "trip-old")[-1:]
    produce_events(settings, more)
    reader = reader_for(configured, None)  # what the CLI's workflow commands read through
    assert isinstance(reader, KafkaHistory) and reader.snapshot == source
    history = reader.read("trip-old")
    assert reader.last.snapshot == str(source) and reader.last.snapshot_events >= 1
    assert reader.last.tail_events == 1
    assert history.events[-1].event_id == more[0].event_id
