"""The projection as a DuckLake: a catalog in PostgreSQL, the data in a bucket.

Any machine reads it with plain DuckDB (``ATTACH 'ducklake:postgres:...' AS lake``); the
projectors of a group write it, each partition's tables by the partition's owner.  This
module is the part both sides share: the extensions, the connection, the names.

**Names.**  One schema per step log (``sl_<log>``, so several logs or fleets share a lake),
one table per partition and projected table (``steps__p0007``, ``events__p0007``;
``steps__<topic>__p0007`` for a topic other than the log's own), and under today's table
names the views analysts query: ``steps`` is the ``UNION ALL`` of every ``steps__...``
table.  DuckLake detects conflicts per table, so writers of different partitions never
conflict (measured: one shared table gave 72 retries in 48 commits with 4 writers, one
table per partition none).

**Extensions.**  DuckLake, ``postgres_scanner`` and ``httpfs`` come as PyPI wheels pinned to
one DuckDB (the ``[lake]`` extra): DuckDB's own extension repository is not reachable
everywhere, so the wheels' files are linked into a private extension directory and loaded
from there, with automatic installation off.  The postgres wheel ships ``postgres`` but
DuckDB loads it under its internal name, ``postgres_scanner``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import duckdb

from stepledger.codec import Codec
from stepledger.domain.events import Event
from stepledger.errors import ConfigError, ViewStoreError
from stepledger.readers.snapshots import decoded

#: The DuckDB the extension wheels are built for (the ``[lake]`` extra pins both).
LAKE_DUCKDB = "1.5.5"
#: (wheel module, file in the wheel, name DuckDB loads it under).
_EXTENSIONS = (
    ("duckdb_extension_ducklake", "ducklake", "ducklake"),
    ("duckdb_extension_postgres", "postgres", "postgres_scanner"),
    ("duckdb_extension_httpfs", "httpfs", "httpfs"),
)
#: Attaches tried again after losing the race to create a fresh lake's catalog, and the
#: first wait before another try (it grows with each).
_INIT_RACES = 5
_INIT_RACE_WAIT_S = 0.2
#: The alias the lake is attached under in every connection stepledger opens.
ALIAS = "lake"
_MISSING = (
    "the lake needs the [lake] extra (pip install 'stepledger[lake]'): "
    "DuckDB {need} with its ducklake, postgres and httpfs extension wheels ({why})"
)


@dataclass(frozen=True)
class LakeConfig:
    """Where the lake is: its catalog database and its data path, and the bucket's key."""

    catalog: str
    """The PostgreSQL catalog: a libpq DSN (``host=... dbname=...``) or a ``postgresql://`` URL."""
    data_path: str = ""
    """Where new data files go: ``s3://bucket/prefix/`` or a directory (empty: the
    catalog's own, as an existing lake remembers it)."""
    s3_endpoint: str = ""
    """An S3-compatible endpoint (``http://127.0.0.1:9000``); empty: AWS itself."""
    s3_key_id: str = ""
    """The bucket's access key id (empty: none, a public or a local path)."""
    s3_secret: str = ""
    """The bucket's secret key."""
    s3_region: str = "us-east-1"
    """The bucket's region."""

    @classmethod
    def from_env(cls, catalog: str, data_path: str = "") -> LakeConfig:
        """The lake at ``catalog``, with the bucket's key from the usual AWS variables."""
        env = os.environ
        return cls(
            catalog=catalog,
            data_path=data_path,
            s3_endpoint=env.get("STEPLEDGER_LAKE_S3_ENDPOINT", env.get("AWS_ENDPOINT_URL", "")),
            s3_key_id=env.get("AWS_ACCESS_KEY_ID", ""),
            s3_secret=env.get("AWS_SECRET_ACCESS_KEY", ""),
            s3_region=env.get("AWS_REGION", env.get("AWS_DEFAULT_REGION", "us-east-1")),
        )

    def attach_sql(self, *, read_only: bool) -> str:
        """The ATTACH statement of this lake under :data:`ALIAS`."""
        options = []
        if self.data_path and not read_only:
            options.append(f"DATA_PATH {_literal(self.data_path)}")
        if read_only:
            options.append("READ_ONLY")
        tail = f" ({', '.join(options)})" if options else ""
        return f"ATTACH {_literal('ducklake:postgres:' + self.catalog)} AS {ALIAS}{tail}"

    def secret_sql(self) -> str | None:
        """The S3 secret the data files are read and written with (None: no key given)."""
        if not self.s3_key_id:
            return None
        parts = [
            "TYPE S3",
            f"KEY_ID {_literal(self.s3_key_id)}",
            f"SECRET {_literal(self.s3_secret)}",
            f"REGION {_literal(self.s3_region)}",
        ]
        if self.s3_endpoint:
            url = urlsplit(
                self.s3_endpoint if "//" in self.s3_endpoint else "//" + self.s3_endpoint
            )
            parts += [
                f"ENDPOINT {_literal(url.netloc)}",
                "URL_STYLE 'path'",
                f"USE_SSL {'false' if url.scheme == 'http' else 'true'}",
            ]
        return f"CREATE OR REPLACE SECRET stepledger_lake ({', '.join(parts)})"


@dataclass(frozen=True)
class LakeSource:
    """What a reader reads in a lake: one step log's tables and views."""

    config: LakeConfig
    """The lake."""
    log: str
    """The step log (topic) whose schema is read."""

    def __str__(self) -> str:
        return f"the lake {_shown(self.config)} (step log {self.log})"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def extension_directory() -> Path:
    """A private extension directory holding the wheels' extensions (made once per process).

    One line names the ``[lake]`` extra when DuckDB is not the pinned version or a wheel is
    missing.
    """
    if duckdb.__version__ != LAKE_DUCKDB:
        raise ConfigError(
            _MISSING.format(
                need=LAKE_DUCKDB, why=f"this environment has DuckDB {duckdb.__version__}"
            )
        )
    files = []
    for module, stem, name in _EXTENSIONS:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(_MISSING.format(need=LAKE_DUCKDB, why=f"{module} is not installed"))
        root = Path(next(iter(spec.submodule_search_locations)))
        found = root / "extensions" / f"v{LAKE_DUCKDB}" / f"{stem}.duckdb_extension"
        if not found.is_file():
            raise ConfigError(_MISSING.format(need=LAKE_DUCKDB, why=f"{found} is missing"))
        files.append((found, name))
    base = Path(tempfile.gettempdir()) / f"stepledger-duckdb-ext-{os.getuid()}"
    target = base / f"v{LAKE_DUCKDB}" / _platform()
    target.mkdir(parents=True, exist_ok=True)
    for found, name in files:
        link = target / f"{name}.duckdb_extension"
        if link.is_symlink() and link.resolve() == found.resolve():
            continue
        partial = target / f".{name}.{os.getpid()}"
        partial.unlink(missing_ok=True)
        partial.symlink_to(found)
        partial.replace(link)  # atomic: a concurrent process sees the old link or the new
    return base


def _platform() -> str:
    with duckdb.connect() as con:
        row = con.execute("PRAGMA platform").fetchone()
    return str(row[0]) if row else "linux_amd64"


def connect_lake(config: LakeConfig, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached as ``lake`` (nothing autoinstalled).

    Several projectors started at once on a fresh lake all create its catalog's tables; all
    but one fail on PostgreSQL's unique constraints, and attach again to the catalog the
    winner made (a bounded number of times).
    """
    directory = extension_directory()
    for attempt in range(_INIT_RACES + 1):
        con = duckdb.connect(
            config={
                "extension_directory": str(directory),
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": True,
            }
        )
        try:
            for _, _, name in _EXTENSIONS:
                con.execute(f"LOAD {name}")
            secret = config.secret_sql()
            if secret is not None:
                con.execute(secret)
            con.execute(config.attach_sql(read_only=read_only))
            return con
        except duckdb.Error as exc:
            con.close()
            if attempt < _INIT_RACES and _lost_init_race(exc):
                time.sleep(_INIT_RACE_WAIT_S * (attempt + 1))
                continue
            why = first_line(exc)
            raise ViewStoreError(f"cannot attach the lake {_shown(config)}: {why}") from exc
    raise AssertionError("unreachable")  # the loop returns or raises


def _lost_init_race(exc: duckdb.Error) -> bool:
    """Whether an ATTACH failed because another process created the fresh lake's catalog."""
    text = str(exc)
    return "Failed to initialize DuckLake" in text and (
        "duplicate key" in text or "already exists" in text
    )


def _shown(config: LakeConfig) -> str:
    """The catalog without a password (for messages)."""
    return shown_catalog(config.catalog)


def shown_catalog(catalog: str) -> str:
    """A catalog DSN with its password starred (``password=...`` or ``user:...@``), for
    messages and reports: a password never leaves the process."""
    return re.sub(r"(password=)\S+|(:)[^:@/]+(@)", r"\1\2***\3", catalog)


def schema_name(log: str) -> str:
    """The lake schema of a step log's tables."""
    return "sl_" + _slug(log)


def table_name(table: str, log: str, topic: str, partition: int) -> str:
    """The lake table holding one projected table's rows of one partition."""
    middle = "" if topic == log else f"__{_slug(topic)}"
    return f"{table}{middle}__p{partition:04d}"


def _slug(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", name).lower()


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (DuckDB's errors span several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect_lake_reader(config: LakeConfig, log: str) -> duckdb.DuckDBPyConnection:
    """A read-only connection whose default schema is the log's (``SELECT * FROM steps``),
    with file access and configuration locked as for a snapshot."""
    con = connect_lake(config, read_only=True)
    try:
        con.execute(f"USE {ALIAS}.{schema_name(log)}")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as exc:
        con.close()
        raise ViewStoreError(
            f"the lake {_shown(config)} has no tables of step log {log!r} yet "
            f"(is a projector writing it?): {first_line(exc)}"
        ) from exc
    return con


def configured_lake(catalog: str | None, log: str) -> LakeSource | None:
    """The lake a reader is configured to read (``Settings.lake``, ``--lake``), or None."""
    return LakeSource(LakeConfig.from_env(catalog), log) if catalog else None


def lake_version(con: duckdb.DuckDBPyConnection) -> str:
    """The lake's newest snapshot id: a token that changes whenever a projector commits."""
    row = con.execute(f"SELECT max(snapshot_id) FROM ducklake_snapshots('{ALIAS}')").fetchone()
    return "" if row is None or row[0] is None else f"lake-{int(row[0])}"


def workflow_events_from_lake(
    source: LakeSource, workflow_id: str, codec: Codec | None = None
) -> tuple[list[Event], dict[tuple[str, int], int]]:
    """One workflow's events in log order from the lake, and the offsets they reach.

    Read in one transaction, so at one lake snapshot, as from a snapshot file: a reader that
    reads each partition's tail from these offsets sees the rest of the workflow.
    """
    codec = codec or Codec()
    con = connect_lake_reader(source.config, source.log)
    try:
        con.execute("BEGIN TRANSACTION")
        offsets = con.execute("SELECT topic, partition, next_offset FROM offsets").fetchall()
        values = con.execute(
            "SELECT value FROM events WHERE workflow_id = ? ORDER BY topic, partition, log_offset",
            [workflow_id],
        ).fetchall()
        con.execute("COMMIT")
    except duckdb.Error as exc:
        raise ViewStoreError(f"cannot read {source}: {first_line(exc)}") from exc
    finally:
        con.close()
    return decoded(workflow_id, values, offsets, codec)
