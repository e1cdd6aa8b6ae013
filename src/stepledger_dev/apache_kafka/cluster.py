"""An Apache Kafka KRaft cluster on loopback: one or more combined broker+controller nodes.

Each node is a JVM started from the cached jars (see ``dist``) with a small heap, its storage
formatted in a private temporary directory that ``stop()`` removes.  Settings favour tests:
no initial rebalance delay, replication and min ISR that fit the node count, short broker
sessions so a killed node is fenced in seconds, and no topic auto-creation (stepledger
creates its topics).  JVMs started from the main thread are killed with their parent if it
dies (Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType

from stepledger.errors import BrokerError
from stepledger_dev.apache_kafka.dist import (
    KAFKA_VERSION,
    class_archive,
    java_executable,
    kafka_libs,
)
from stepledger_dev.apache_kafka.secure import Security
from stepledger_dev.broker import LOOPBACK, free_port, wait_for_port

#: JVM options for one node: a small heap and a quick start on a 2-core machine.
JVM_OPTIONS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
_PR_SET_PDEATHSIG = 1


@dataclass
class KafkaNode:
    """One combined broker+controller JVM of the cluster."""

    node_id: int
    port: int
    controller_port: int
    directory: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """This node's client listener."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the JVM lives (a SIGSTOPped JVM still counts)."""
        return self.process is not None and self.process.poll() is None


@dataclass
class KafkaBroker:
    """Apache Kafka (KRaft) on loopback, started and stopped by this process.

    Parallel to ``LocalBroker``: a context manager with a ``bootstrap`` property.
    """

    nodes: int = 1
    port: int = 0
    """Client port of the first node (0: any free port)."""
    log_dir: Path | None = None
    """Where each node writes ``kafka-<id>.log``; default: inside the temporary directory."""
    version: str = KAFKA_VERSION
    server_overrides: dict[str, str] = field(default_factory=dict)
    """Broker settings that replace or add to the launcher's (``server.properties`` keys)."""
    security: Security | None = None
    """Secure the cluster (SASL/SCRAM clients, ACLs, this super user); None: open listeners."""
    members: list[KafkaNode] = field(default_factory=list)
    workdir: Path | None = None
    jvm_options: tuple[str, ...] | None = None
    """Options every JVM of this cluster adds; None: the class-data archive, once made."""

    def _jvm(self) -> tuple[str, ...]:
        if self.jvm_options is not None:
            return self.jvm_options
        archive = class_archive(self.version)
        return (f"-XX:SharedArchiveFile={archive}",) if archive.is_file() else ()

    @property
    def client_settings(self) -> dict[str, str]:
        """The librdkafka settings a client adds to ``bootstrap`` (the super user's when
        secured; none when open)."""
        return self.security.client_settings() if self.security else {}

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use (every node, comma-separated)."""
        return ",".join(node.address for node in self.members)

    @property
    def running(self) -> bool:
        """True while every node's JVM lives."""
        return bool(self.members) and all(node.running for node in self.members)

    def start(self, timeout: float = 60.0) -> KafkaBroker:
        """Format each node's storage, start the JVMs and wait until every broker serves."""
        if self.nodes < 1:
            raise BrokerError("a Kafka cluster needs at least one node", retryable=False)
        java = java_executable()
        classpath = str(kafka_libs(self.version) / "*")
        self.workdir = Path(tempfile.mkdtemp(prefix="stepledger-kafka-"))
        try:
            self._layout()
            extra = self.security.format_arguments() if self.security else []
            _format_all(java, classpath, self.members, _cluster_id(), timeout, extra, self._jvm())
            for node in self.members:
                self._launch(java, classpath, node)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _layout(self) -> None:
        assert self.workdir is not None
        logs = self.log_dir or self.workdir
        logs.mkdir(parents=True, exist_ok=True)
        log4j = self.workdir / "log4j2.properties"
        log4j.write_bytes(resources.files(__package__).joinpath("log4j2.properties").read_bytes())
        ports = [self.port or free_port()] + [free_port() for _ in range(self.nodes - 1)]
        self.members = [
            KafkaNode(i + 1, ports[i], free_port(), self.workdir / f"node-{i + 1}",
                      logs / f"kafka-{i + 1}.log")
            for i in range(self.nodes)
        ]  # fmt: skip
        voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.controller_port}" for n in self.members)
        for node in self.members:
            node.directory.mkdir()
            secured = (
                self.security.server_settings(node.port, node.controller_port, LOOPBACK)
                if self.security
                else {}
            )
            overrides = {**secured, **self.server_overrides}
            text = server_properties(node, voters, self.nodes, overrides)
            (node.directory / "server.properties").write_text(text)

    def _launch(self, java: str, classpath: str, node: KafkaNode) -> None:
        assert self.workdir is not None
        log = open(node.log_path, "ab")  # noqa: SIM115 - the child keeps it
        try:
            node.process = subprocess.Popen(
                [
                    *_java_command(java, classpath, self.workdir, "kafka.Kafka", self._jvm()),
                    str(node.directory / "server.properties"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        finally:
            log.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every running node's broker serves metadata listing all running nodes."""
        deadline = time.monotonic() + timeout
        running = [node for node in self.members if node.running]
        for node in running:
            wait_for_port(node.port, max(0.1, deadline - time.monotonic()), node.process)
        bootstrap = ",".join(n.address for n in running)
        _wait_brokers(bootstrap, len(running), deadline, running, self.client_settings)

    def node(self, node_id: int) -> KafkaNode:
        """The node with this id (1-based)."""
        for member in self.members:
            if member.node_id == node_id:
                return member
        raise BrokerError(f"no Kafka node {node_id}", retryable=False)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (its storage stays, so ``restart_node`` brings it back)."""
        node = self.node(node_id)
        if node.process is not None:
            with contextlib.suppress(ProcessLookupError):
                node.process.send_signal(signal.SIGCONT)
            node.process.kill()
            node.process.wait(10)
            node.process = None

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP one node: it stops heartbeating but keeps its sockets."""
        process = self.node(node_id).process
        if process is not None:
            process.send_signal(signal.SIGSTOP)

    def resume_node(self, node_id: int) -> None:
        """SIGCONT a node stopped by ``pause_node``."""
        process = self.node(node_id).process
        if process is not None:
            process.send_signal(signal.SIGCONT)

    def restart_node(self, node_id: int, timeout: float = 60.0) -> None:
        """Start a killed node again on its ports and storage, and wait until it serves."""
        node = self.node(node_id)
        if node.running or self.workdir is None:
            return
        java = java_executable()
        self._launch(java, str(kafka_libs(self.version) / "*"), node)
        wait_for_port(node.port, timeout, node.process)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every node at once, kill what outlives ``grace``, remove the storage."""
        live = [n.process for n in self.members if n.process is not None]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in live:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for node in self.members:
            node.process = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> KafkaBroker:
        return self.start() if not self.members else self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def server_properties(
    node: KafkaNode, voters: str, nodes: int, overrides: Mapping[str, object] | None = None
) -> str:
    """The ``server.properties`` of one combined node in a cluster of ``nodes``."""
    min_isr = 2 if nodes >= 3 else 1
    settings: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{LOOPBACK}:{node.port},CONTROLLER://{LOOPBACK}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": node.directory / "data",
        "auto.create.topics.enable": "false",
        "num.partitions": 3,
        "default.replication.factor": nodes,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": nodes,
        "offsets.topic.num.partitions": 10,
        "transaction.state.log.replication.factor": nodes,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": 5,
        "share.coordinator.state.topic.replication.factor": nodes,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": 0,
        # Tests run consumer groups with 1-2 s sessions to make failover quick.
        "group.min.session.timeout.ms": 1000,
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 3000,
        "log.segment.bytes": 16 * 1024 * 1024,
        # Retention tests expire segments for real (short retention.ms and segment.ms on
        # their topic); every other topic keeps everything, so the check finds nothing.
        "log.retention.check.interval.ms": 1000,
        "num.network.threads": 2,
        "num.io.threads": 2,
        "num.recovery.threads.per.data.dir": 1,
        **(overrides or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _cluster_id() -> str:
    # As Kafka's own Uuid.randomUuid: an id starting with "-" is read as an option by
    # kafka-storage's argument parser (measured: "--cluster-id: expected one argument").
    for _ in range(100):
        made = urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not made.startswith("-"):
            return made
    raise BrokerError("no usable Kafka cluster id", retryable=False)


def archive_classes(version: str = KAFKA_VERSION, timeout: float = 60.0) -> Path:
    """Make the broker's class-data archive once (Java 17's dynamic CDS), and return its path.

    A one-node broker is started and stopped cleanly with ``-XX:ArchiveClassesAtExit``; the
    archive is written beside the jars under a private name and renamed into place, so two
    processes making it at once leave one whole archive.  Every later JVM of this launcher
    starts with it (``_java_command``).
    """
    final = class_archive(version)
    if final.is_file():
        return final
    staging = final.with_name(f".classes-{uuid.uuid4().hex}.jsa")
    broker = KafkaBroker(nodes=1, version=version)
    broker.jvm_options = (f"-XX:ArchiveClassesAtExit={staging}",)
    try:
        broker.start(timeout)
        broker.stop()
        if staging.is_file():
            os.replace(staging, final)
    finally:
        broker.stop()
        staging.unlink(missing_ok=True)
    return final


def _java_command(
    java: str, classpath: str, workdir: Path, main: str, extra: tuple[str, ...]
) -> list[str]:
    return [
        java,
        *JVM_OPTIONS,
        *extra,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        "-cp",
        classpath,
        main,
    ]


def _format_all(
    java: str,
    classpath: str,
    nodes: list[KafkaNode],
    cluster_id: str,
    timeout: float,
    extra: list[str],
    jvm: tuple[str, ...],
) -> None:
    """Format every node's storage (in parallel: each format is a JVM start)."""
    assert nodes
    workdir = nodes[0].directory.parent
    command = _java_command(java, classpath, workdir, "kafka.tools.StorageTool", jvm)
    running = [
        (node, subprocess.Popen(
            [*command, "format", "-t", cluster_id, "-c", str(node.directory / "server.properties"),
             *extra],
            # The output names a SCRAM user's salted password: it is read here, never shown.
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        ))
        for node in nodes
    ]  # fmt: skip
    for node, process in running:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise BrokerError(
                f"formatting Kafka node {node.node_id} took over {timeout:.0f}s"
            ) from None
        if process.returncode != 0:
            last = output.decode(errors="replace").strip().splitlines()[-1:]
            raise BrokerError(f"formatting Kafka node {node.node_id} failed: {' '.join(last)}")


def _wait_brokers(
    bootstrap: str,
    expected: int,
    deadline: float,
    nodes: list[KafkaNode],
    client: dict[str, str],
) -> None:
    from stepledger.config import Settings
    from stepledger.kafka.describe import ClusterView

    cluster = ClusterView(Settings(bootstrap=bootstrap, kafka={"log_level": "2", **client}))
    seen = 0
    while time.monotonic() < deadline:
        for node in nodes:
            if not node.running:
                raise BrokerError(f"Kafka node {node.node_id} exited; see {node.log_path}")
        try:
            seen = cluster.layout(timeout=1.0).brokers
        except BrokerError:
            seen = 0
        if seen >= expected:
            return
        time.sleep(0.1)
    raise BrokerError(f"Kafka served {seen} of {expected} brokers by the deadline")


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that makes the kernel SIGKILL the JVM when this process dies.

    Linux delivers the signal when the *thread* that forked the child exits, so the hook is
    armed only for JVMs started from the main thread: a node restarted from a worker thread
    (a fault injector) must outlive that thread.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return arm
