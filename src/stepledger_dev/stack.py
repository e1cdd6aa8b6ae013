"""A local stack: a broker, the example tool services, the projector and the recovery daemon.

What ``stepledger demo`` and the chaos harness both run.  Everything is a real process on
loopback: the broker (a local Tansu on memory storage, on loopback S3 storage with
``durable_broker``, an Apache Kafka cluster with ``engine="kafka"``, or none when
``bootstrap`` names yours), the payments, bookings and
email services, ``stepledger project`` and ``stepledger recover`` as supervised
subprocesses, and any agent processes spawned through :meth:`LocalStack.spawn`.  Every
process the stack starts is tracked, and :meth:`LocalStack.stop` stops all of them (also
when the caller is interrupted), so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import duckdb

from stepledger.config import DERIVED_NAMES, Settings
from stepledger.errors import ViewStoreError
from stepledger.kafka import ensure_topics
from stepledger.kafka.provision import create_fleet
from stepledger.kafka.topics import checkpoint_topic_config, step_log_config
from stepledger.projector.snapshot import latest_snapshot
from stepledger.readers.lake import LakeConfig, connect_lake_reader
from stepledger.readers.snapshots import connect_union, shard_snapshots
from stepledger_dev.apache_kafka import KafkaBroker
from stepledger_dev.apache_kafka.secure import Security
from stepledger_dev.broker import LocalBroker, S3Storage
from stepledger_dev.chaos.procs import STEPLEDGER, Proc, wait_until
from stepledger_dev.examples.clients import RunningService, ServiceKind, start_service

SERVICES: tuple[ServiceKind, ...] = ("payments", "bookings", "email")
TOOLS = "stepledger_dev.examples.tools:registry"
# The directory holding the `stepledger` package: children import it even when it is only
# on this process's path (tests run with PYTHONPATH=src).
_IMPORT_ROOT = Path(__file__).resolve().parents[2]
Engine = Literal["tansu", "kafka"]
DaemonRole = Literal["projector", "recovery"]


@dataclass(frozen=True)
class StackOptions:
    """What the stack starts and how its children are configured."""

    bootstrap: str | None = None
    """Your broker (HOST:PORT); None starts a local one on loopback."""
    durable_broker: bool = False
    """Run the local broker on loopback S3 storage, so it survives graceful restarts."""
    engine: Engine = "tansu"
    """The local broker: the bundled Tansu, or Apache Kafka (needs Java 17+)."""
    nodes: int = 1
    """Apache Kafka nodes (3: replication factor 3, min.insync.replicas 2)."""
    topic_prefix: str = "stepledger"
    """Topic names are this prefix plus a unique suffix (a shared cluster stays clean)."""
    fleet_id: str = "default"
    """The fleet every child process tags its events with."""
    partitions: int = 3
    """Partitions of the step-log and dead-letter topics."""
    tool_timeout_s: float = 1.0
    """The example tools' timeout, so an intent's deadline comes soon after a crash."""
    max_attempts: int = 3
    """Workflow and recovery attempt limits of the children."""
    recovery_grace: str = "500ms"
    """How long recovery waits past an intent's deadline before resolving it."""
    recovery_session_timeout: str = "6s"
    """The recovery daemon's consumer-group session timeout (shorter joins faster)."""
    projector_session_timeout_s: float = 6.0
    """The projector's consumer-group session timeout in seconds."""
    snapshot_interval_s: float = 1.0
    """Seconds between the projector's read-only snapshots."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment for every child process."""
    names: tuple[tuple[str, str], ...] = ()
    """Settings given instead of the names derived from the step log (``checkpoint_topic``,
    ...), for the stack and every child: none by default, as a deployment on defaults."""
    daemon_log_level: str = "WARNING"
    """Log level of the projector and the recovery daemon (their logs go to files)."""
    projectors: int = 1
    """Projector processes in one group; more than one project into a shard directory."""
    recoverers: int = 1
    """Recovery daemons in one group (their state is on the recovery changelog topic)."""
    no_shared_state: bool = False
    """No volume shared between members: each projector projects into a shard directory of
    its own (``<workdir>/<name>/``), a checkpointer writes the workflow checkpoints, and
    agents open workflows from Kafka rather than from a projection's snapshot."""
    secure: bool = False
    """A secured Apache Kafka (SASL/SCRAM, ACLs): the step log is a fleet made by
    ``fleet create``, and each child runs with its own role's config (least privilege)."""
    kafka: tuple[tuple[str, str], ...] = ()
    """The super user's client settings, for a stack on a secured cluster it did not start."""
    lake: LakeConfig | None = None
    """Project into this DuckLake (``project --lake``): every projector commits to it, each
    with a state directory of its own; implies ``no_shared_state`` for everything else."""

    @property
    def scaled(self) -> bool:
        """True when several instances of a daemon share the partitions."""
        return self.projectors > 1 or self.recoverers > 1


@dataclass
class LocalStack:
    """The running stack; use it as a context manager or call ``start`` and ``stop``."""

    workdir: Path
    options: StackOptions = field(default_factory=StackOptions)
    base: Settings = field(default_factory=Settings)
    settings: Settings = field(init=False)
    broker: LocalBroker | None = None
    kafka: KafkaBroker | None = None
    storage: S3Storage | None = None
    services: dict[str, RunningService] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    spawned: list[subprocess.Popen[Any]] = field(default_factory=list)
    _started: list[tuple[str, subprocess.Popen[Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.settings = self.base
        # Every child inherits this mark (through os.environ), so stop() can find one an
        # interrupt caught between its fork and its registration, and stop it too.
        self.mark = uuid.uuid4().hex
        os.environ[STACK_MARK_ENV] = self.mark

    @property
    def db(self) -> Path:
        """The live projection: one DuckDB file, or a shard directory with several projectors.

        Read its snapshots, never the live files.
        """
        if self.options.projectors > 1:
            return self.workdir / "shards"
        return self.workdir / "ledger.duckdb"

    def agent_db(self) -> Path | None:
        """The projection agents open workflows from (None: from Kafka alone)."""
        return None if self.options.no_shared_state else self.db

    def projections(self) -> list[Path]:
        """Every place a projector projects into: the one path, or each member's directory.

        Without a shared volume a member that lost a partition leaves a stale shard behind;
        read them with :func:`stepledger.readers.snapshots.connect_union`, which keeps the freshest.
        """
        if not self.options.no_shared_state:
            return [self.db]
        return [self._projector_db(p.name) for p in self.daemons("projector")]

    def _projector_db(self, name: str) -> Path:
        return self.workdir / name if self.options.no_shared_state else self.db

    # -- starting -------------------------------------------------------------------------

    def start(self) -> LocalStack:
        """Start the broker (unless given one), create unique topics, start the services."""
        try:
            self._start_broker()
            suffix = uuid.uuid4().hex[:8]
            prefix = self.options.topic_prefix
            # Only the step log is named: its state topics and groups are named after it,
            # as a deployment on defaults has them.
            topic = f"{prefix}-{suffix}"
            values: dict[str, Any] = {
                **self.base.model_dump(exclude=set(DERIVED_NAMES)),
                "bootstrap": self.options.bootstrap or self._local_bootstrap(),
                "topic": topic,
                # A fleet's events name the fleet its step log is (its daemons refuse others).
                "fleet_id": topic if self.options.secure else self.options.fleet_id,
                **dict(self.options.names),
            }
            admin = {**self.base.kafka, **dict(self.options.kafka)}
            if self.kafka is not None:
                admin.update(self.kafka.client_settings)
            self.settings = Settings(**{**values, "kafka": admin})
            if self.options.secure:
                create_fleet(self.settings, topic, self.fleet_dir, self.options.partitions)
            topics = [self.settings.topic, self.settings.dlq_topic]
            # As `stepledger init` makes them: kept forever, stamped with broker time.
            configs = {self.settings.topic: step_log_config()}
            if self.options.no_shared_state:  # as `init --checkpoints` makes it
                topics.append(self.settings.checkpoint_topic)
                configs[self.settings.checkpoint_topic] = checkpoint_topic_config()
            ensure_topics(
                self.settings, topics, partitions=self.options.partitions, configs=configs
            )
            self._start_services()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_broker(self) -> None:
        if self.options.bootstrap:
            return
        if self.options.engine == "kafka":
            security = Security() if self.options.secure else None
            self.kafka = KafkaBroker(
                nodes=self.options.nodes, log_dir=self.workdir / "kafka", security=security
            )
            try:
                self.kafka.start()
            finally:
                for node in self.kafka.members:
                    self._track("broker", node.process)
            return
        if self.options.durable_broker:
            self.storage = S3Storage()
            try:
                self.storage.start()
            finally:
                self._track("storage", self.storage.process)
        self.broker = LocalBroker(storage=self.storage, log_path=self.workdir / "broker.log")
        try:
            self.broker.start()
        finally:
            self._track("broker", self.broker.process)

    def _local_bootstrap(self) -> str:
        local = self.kafka or self.broker
        assert local is not None
        return local.bootstrap

    def _start_services(self) -> None:
        # Started side by side: each waits for its child to answer a health check.
        pool = ThreadPoolExecutor(len(SERVICES))
        futures = {
            kind: pool.submit(start_service, kind, self.workdir / f"{kind}.sqlite")
            for kind in SERVICES
        }
        try:
            wait(futures.values())
        finally:
            # Also when interrupted: every start finishes, so every started service is known
            # (and stopped by `stop`).
            pool.shutdown(wait=True)
            for kind, future in futures.items():
                if future.exception() is None:
                    self.services[kind] = future.result()
                    self._track(kind, self.services[kind].process)
        for future in futures.values():
            failure = future.exception()
            if failure is not None:
                raise failure

    def start_daemons(self) -> None:
        """Start the projectors and recovery daemons as supervised subprocesses.

        One of each is named ``projector`` and ``recovery``; with several, ``projector-0``,
        ``projector-1``, ... (and likewise for recovery).
        """
        for _ in range(self.options.projectors):
            self.add_daemon("projector")
        for _ in range(self.options.recoverers):
            self.add_daemon("recovery")
        if self.options.no_shared_state:
            self._start_checkpointer()

    def _start_checkpointer(self) -> None:
        """One checkpointer (a member of the group TOPIC.checkpointer: it takes every partition)."""
        argv = [
            *STEPLEDGER,
            "checkpoint",
            *("--every", "1", "--log-level", self.options.daemon_log_level),
        ]
        env = self.child_env(role="checkpointer")
        proc = Proc("checkpointer", argv, env, self.workdir / "checkpointer.log")
        self.procs["checkpointer"] = proc.start()
        self._track("checkpointer", proc.process)

    def add_daemon(self, role: DaemonRole) -> Proc:
        """Start one more projector or recovery daemon (in the same group as the others)."""
        many = self.options.projectors if role == "projector" else self.options.recoverers
        number = sum(1 for name in self.procs if name.split("-")[0] == role)
        name = f"{role}-{number}" if many > 1 else role
        argv = self._projector_argv(name) if role == "projector" else self._recovery_argv(name)
        env = self.child_env(role=role)
        proc = Proc(name, argv, env, self.workdir / f"{name}.log").start()
        self.procs[name] = proc
        self._track(role, proc.process)
        return proc

    def daemons(self, role: DaemonRole) -> list[Proc]:
        """The projectors or the recovery daemons started so far (alive or not)."""
        return [p for name, p in self.procs.items() if name.split("-")[0] == role]

    def _projector_argv(self, name: str) -> list[str]:
        lake = self.options.lake
        into = [] if lake is None else ["--lake", lake.catalog, "--data-path", lake.data_path]
        return [
            *STEPLEDGER,
            "project",
            *into,
            "--db",
            str(self._projector_db(name)),
            "--snapshot-interval",
            f"{self.options.snapshot_interval_s:g}",
            "--session-timeout",
            f"{self.options.projector_session_timeout_s:g}",
            "--log-level",
            self.options.daemon_log_level,
        ]

    def _recovery_argv(self, name: str) -> list[str]:
        return [
            *STEPLEDGER,
            "recover",
            "--tools",
            TOOLS,
            "--state-dir",
            str(self.workdir / name),
            "--grace",
            self.options.recovery_grace,
            "--session-timeout",
            self.options.recovery_session_timeout,
            "--log-level",
            self.options.daemon_log_level,
        ]

    @property
    def fleet_dir(self) -> Path:
        """Where a secured stack's fleet keeps each role's config file."""
        return self.workdir / "fleet"

    def child_env(self, role: str = "agent", **extra: str) -> dict[str, str]:
        """The environment every child process gets: settings, service URLs, tool limits;
        on a secured stack, ``role``'s own config file instead of the super user's settings."""
        inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        path = [str(_IMPORT_ROOT), *filter(None, inherited)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
            "PYTHONUNBUFFERED": "1",
            "STEPLEDGER_BOOTSTRAP": self.settings.bootstrap,
            "STEPLEDGER_TOPIC": self.settings.topic,
            "STEPLEDGER_FLEET_ID": self.settings.fleet_id,
            # A daemon (re)started while the broker restarts waits for it, as a pod would be
            # restarted by its supervisor, instead of leaving the stack without it.
            "STEPLEDGER_STARTUP_WAIT_S": "30",
            "STEPLEDGER_TOOL_TIMEOUT_S": str(self.options.tool_timeout_s),
            "STEPLEDGER_MAX_ATTEMPTS": str(self.options.max_attempts),
            **{f"STEPLEDGER_{k.upper()}_URL": s.url for k, s in self.services.items()},
            **_kafka_env(self.settings.kafka),
            **dict(self.options.env),
            # This stack's own mark, whatever another stack of this process set since.
            STACK_MARK_ENV: self.mark,
            **{f"STEPLEDGER_{name.upper()}": value for name, value in self.options.names},
        }
        if self.options.lake is not None:
            env.update(_lake_env(self.options.lake))
        if self.options.secure:
            for key in _kafka_env(self.settings.kafka):
                env.pop(key, None)
            env["STEPLEDGER_CONFIG"] = str(self.fleet_dir / f"{self.settings.topic}-{role}.toml")
        env.update(extra)
        return env

    def spawn(
        self, argv: list[str], *, env: dict[str, str] | None = None, stderr: Path | None = None
    ) -> subprocess.Popen[str]:
        """Start a tracked child (an agent), its stdout piped as text; it stops with the stack."""
        err: IO[bytes] | int = subprocess.DEVNULL
        if stderr is not None:
            err = open(stderr, "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                env=self.child_env() if env is None else env,
            )
        finally:
            if not isinstance(err, int):
                err.close()
        self.spawned.append(proc)
        self._track("agent", proc)
        return proc

    # -- reading what the projector published ----------------------------------------------

    def snapshot_events(self) -> int | None:
        """How many events the projector's latest snapshot holds (None: none readable yet).

        With a shard directory: the events of the union of the shards' snapshots.
        """
        try:
            con = self._open_snapshots()
        except (duckdb.Error, ViewStoreError):  # none yet, or one being replaced: ask again
            return None
        if con is None:
            return None
        try:
            row = con.execute("SELECT count(*) FROM events").fetchone()
        except duckdb.Error:
            return None
        finally:
            con.close()
        return None if row is None else int(row[0])

    def _open_snapshots(self) -> duckdb.DuckDBPyConnection | None:
        if self.options.lake is not None:  # what an analyst reads: the lake itself
            return connect_lake_reader(self.options.lake, self.settings.topic)
        if self.options.no_shared_state:
            places = self.projections()
            found = any(shard_snapshots(p) for p in places)
            return connect_union(*places) if found else None
        if self.options.projectors > 1:
            return connect_union(self.db) if shard_snapshots(self.db) else None
        snap = latest_snapshot(self.db)
        return None if snap is None else duckdb.connect(str(snap), read_only=True)

    def wait_snapshot(self, events: int, timeout: float) -> bool:
        """Wait until the snapshot holds at least ``events`` events; False on timeout."""
        return wait_until(lambda: (self.snapshot_events() or 0) >= events, timeout, 0.2)

    # -- stopping -------------------------------------------------------------------------

    def stop(self, grace: float = 10.0) -> None:
        """Stop every process the stack started: agents, daemons, services, broker, storage.

        An interrupt (a second Ctrl-C) during one stop kills that process and the rest are
        still stopped before the interrupt is raised again.
        """
        steps: list[tuple[Callable[[], object], Callable[[], object]]] = []
        for proc in self.spawned:
            steps.append((functools.partial(_reap, proc), proc.kill))
        for daemon in self.procs.values():
            steps.append((functools.partial(daemon.stop, grace=grace), daemon.kill))
        for service in self.services.values():
            steps.append((service.stop, service.kill))
        for holder in (self.broker, self.storage):  # the current process, after restarts too
            if holder is not None:
                steps.append((holder.stop, functools.partial(_kill_current, holder)))
        if self.kafka is not None:
            steps.append((self.kafka.stop, functools.partial(_kill_nodes, self.kafka)))
        steps.append((functools.partial(kill_marked, self.mark), lambda: None))
        pending: BaseException | None = None
        for stop, kill in steps:
            try:
                stop()
            except BaseException as exc:
                pending = pending or exc
                with contextlib.suppress(Exception):
                    kill()
        if pending is not None:
            raise pending

    def alive(self) -> list[tuple[str, int]]:
        """Every process the stack started that still runs, as (role, pid)."""
        current = [(name, d.process) for name, d in self.procs.items()]
        current += [("broker", self.broker.process if self.broker else None)]
        current += [("storage", self.storage.process if self.storage else None)]
        current += [("broker", n.process) for n in (self.kafka.members if self.kafka else [])]
        running = {
            (role, proc.pid)
            for role, proc in [*self._started, *current]
            if proc is not None and proc.poll() is None
        }
        return sorted(running)

    def started(self) -> int:
        """How many processes the stack started, restarts by callers included."""
        return len(self._started) + sum(max(0, d.starts - 1) for d in self.procs.values())

    def track(self, role: str, proc: subprocess.Popen[Any] | None) -> None:
        """Stop this process with the stack (one the caller started beside the daemons)."""
        self._track(role, proc)

    def _track(self, role: str, proc: subprocess.Popen[Any] | None) -> None:
        if proc is not None:
            self._started.append((role, proc))

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


STACK_MARK_ENV = "STEPLEDGER_STACK_MARK"


def kill_marked(mark: str) -> list[int]:
    """SIGKILL every process whose environment carries this stack's mark (Linux /proc)."""
    needle = f"{STACK_MARK_ENV}={mark}".encode()
    killed = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ValueError):
            continue  # gone, or not ours to read
    return killed


def _lake_env(lake: LakeConfig) -> dict[str, str]:
    """The bucket's key and endpoint as a lake projector reads them (``LakeConfig.from_env``)."""
    return {
        "AWS_ACCESS_KEY_ID": lake.s3_key_id,
        "AWS_SECRET_ACCESS_KEY": lake.s3_secret,
        "AWS_REGION": lake.s3_region,
        "AWS_ENDPOINT_URL": lake.s3_endpoint,
    }


def _kafka_env(kafka: dict[str, str]) -> dict[str, str]:
    # The inverse of config's STEPLEDGER_KAFKA_<KEY> mapping: children get -X settings too.
    return {f"STEPLEDGER_KAFKA_{k.upper().replace('.', '_')}": v for k, v in kafka.items()}


def _reap(proc: subprocess.Popen[Any]) -> None:
    # An agent still running when the stack stops is killed; its piped stdout is drained
    # (unless the caller already read it) so the pipe closes and the process is waited for.
    if proc.poll() is None:
        proc.kill()
    if proc.stdout is not None and not proc.stdout.closed:
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
            proc.communicate(timeout=10)
    proc.wait(10)


def _kill_nodes(kafka: KafkaBroker) -> None:
    for node in kafka.members:
        kafka.kill_node(node.node_id)


def _kill_current(holder: LocalBroker | S3Storage) -> None:
    if holder.process is not None and holder.process.poll() is None:
        holder.process.kill()
        holder.process.wait(10)
