"""The Apache Kafka launcher: starts, serves, stops on SIGTERM leaving nothing, fails clearly."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from stepledger.config import Settings
from stepledger.kafka import DurableProducer, ensure_topics
from stepledger_dev import apache_kafka
from stepledger_dev.apache_kafka import KafkaBroker, dist

CLI = [sys.executable, "-m", "stepledger"]
needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="needs java")
kafka_only = pytest.mark.kafka_only


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name may hold spaces; the parent pid follows its closing paren.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _storage_of(pid: int) -> Path:
    args = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    config = next(a.decode() for a in args if a.endswith(b"server.properties"))
    return Path(config).parent.parent


def _wait_line(proc: subprocess.Popen[str], pattern: str, timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r} in {seen}")


@kafka_only
@needs_java
def test_cli_broker_serves_and_sigterm_leaves_no_process_and_no_directory(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    started = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "broker", "--engine", "kafka", "--port", "0", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=src_env,
    )
    try:
        line = _wait_line(proc, r"^export STEPLEDGER_BOOTSTRAP=", 120)
        assert time.monotonic() - started < 60
        bootstrap = line.strip().split("=", 1)[1]
        jvms = _children(proc.pid)
        assert len(jvms) == 1
        storage = _storage_of(jvms[0])
        assert storage.is_dir()

        topic = f"launcher-{uuid.uuid4().hex[:8]}"
        settings = Settings(bootstrap=bootstrap, topic=topic, durable_timeout_s=20.0)
        ensure_topics(settings, [topic], partitions=1)
        producer = DurableProducer(settings)
        first = producer.append(topic, b"k", b"one")
        producer.append(topic, b"k", b"two")
        producer.close()
        assert first.offset == 0
        assert _consume(bootstrap, topic, 2) == [b"one", b"two"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "broker stopped" in out
    assert not [pid for pid in jvms if Path(f"/proc/{pid}").exists()]
    assert not storage.exists()
    assert (tmp_path / "kafka-1.log").read_text()


def _consume(bootstrap: str, topic: str, count: int) -> list[bytes | None]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"launcher-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    values: list[bytes | None] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_missing_java_is_one_line_and_a_non_zero_exit(src_env: dict[str, str]) -> None:
    env = {**src_env, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [*CLI, "broker", "--engine", "kafka", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Java 17+" in lines[0] and "'java'" in lines[0]


@kafka_only
@needs_java
def test_missing_maven_with_an_empty_cache_is_one_line(
    tmp_path: Path, src_env: dict[str, str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = shutil.which("java")
    assert java is not None
    (bin_dir / "java").symlink_to(os.path.realpath(java))
    env = {
        **src_env,
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}",
        "STEPLEDGER_KAFKA_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [*CLI, "broker", "--engine", "kafka", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs Maven" in lines[0]


@kafka_only
def test_two_fetches_at_once_run_maven_once_and_see_a_complete_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "mvn"
    fake.parent.mkdir()
    # A stand-in for Maven: slow enough that both fetches overlap; counts its runs.
    fake.write_text(
        "#!/bin/sh\n"
        f"echo run >> {calls}\n"
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#*=}";; esac; done\n'
        'sleep 1; mkdir -p "$out" && echo jar > "$out/kafka_2.13-9.9.9.jar"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STEPLEDGER_KAFKA_CACHE", str(tmp_path / "cache"))
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(dist.kafka_libs("9.9.9", timeout=30)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0] / "kafka_2.13-9.9.9.jar").is_file()
    assert calls.read_text().count("run") == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "kafka-9.9.9",
        "kafka-9.9.9.lock",
    ]


@kafka_only
@needs_java
def test_a_node_restarted_from_a_worker_thread_outlives_that_thread(tmp_path: Path) -> None:
    # The kernel's parent-death signal follows the forking *thread*: a JVM armed with it and
    # started by a fault-injecting thread died when that thread ended.
    with KafkaBroker(log_dir=tmp_path) as kafka:
        kafka.kill_node(1)
        assert not kafka.running
        worker = threading.Thread(target=kafka.restart_node, args=(1,))
        worker.start()
        worker.join(120)
        process = kafka.node(1).process
        assert process is not None
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(3)
        kafka.wait_ready(60)
        topic = f"restart-{uuid.uuid4().hex[:8]}"
        settings = Settings(bootstrap=kafka.bootstrap, topic=topic, durable_timeout_s=20.0)
        ensure_topics(settings, [topic], partitions=1)
        producer = DurableProducer(settings)
        assert producer.append(topic, b"k", b"v").offset == 0
        producer.close()


@needs_java
@kafka_only
def test_a_broker_started_after_the_class_archive_is_made_maps_its_classes_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache of its own (the jars linked from the shared one), so the archive is made here.
    shared = dist.kafka_libs()
    cache = tmp_path / "cache"
    (cache / f"kafka-{dist.KAFKA_VERSION}").mkdir(parents=True)
    (cache / f"kafka-{dist.KAFKA_VERSION}" / "lib").symlink_to(shared)
    (cache / f"kafka-{dist.KAFKA_VERSION}" / "complete").write_text(dist.KAFKA_VERSION)
    monkeypatch.setenv("STEPLEDGER_KAFKA_CACHE", str(cache))
    archive = apache_kafka.archive_classes()
    assert archive == dist.class_archive() and archive.stat().st_size > 1_000_000
    assert not [p for p in archive.parent.iterdir() if p.name.startswith(".classes-")]
    with KafkaBroker() as broker:
        process = broker.members[0].process
        assert process is not None
        # Mapped, not only named: a JVM that refused the archive would not map it.
        assert str(archive) in (Path("/proc") / str(process.pid) / "maps").read_text()
