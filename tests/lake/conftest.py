"""Fixtures of the lake tests: a PostgreSQL and an S3 server on loopback per module.

The lake needs DuckDB 1.5.5 and the extension wheels of the ``[lake]`` extra; elsewhere
(the development venv's DuckDB 2) these tests are skipped with the reason, and CI runs them
in a venv of their own (.ci/run).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pytest

from stepledger.errors import ConfigError
from stepledger.readers.lake import LakeConfig, extension_directory
from stepledger_dev.lake_stack import LakeStack, lake_stack
from stepledger_dev.postgres import postgres_missing


def _unavailable() -> str | None:
    try:
        extension_directory()
    except ConfigError as exc:
        return exc.message
    return postgres_missing()


@pytest.fixture(scope="module")
def stack() -> Iterator[LakeStack]:
    """A PostgreSQL and an S3 server for the module's tests."""
    why = _unavailable()
    if why is not None:
        pytest.skip(why)
    with lake_stack() as running:
        yield running


@pytest.fixture
def lake(stack: LakeStack, monkeypatch: pytest.MonkeyPatch) -> LakeConfig:
    """An empty lake of its own (catalog database and bucket); the bucket's key in the env."""
    for name, value in stack.env().items():
        monkeypatch.setenv(name, value)
    return stack.new_lake()


def lake_contents(con: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every projected table's rows through the lake's views, sorted, for comparing builds."""
    from stepledger.projector.schema import TABLES

    return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}


def read_lake(config: LakeConfig, log: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every projected table of a log in a lake, sorted (what an analyst reads)."""
    from stepledger.readers.lake import connect_lake_reader

    con = connect_lake_reader(config, log)
    try:
        return lake_contents(con)
    finally:
        con.close()


def lake_offsets(config: LakeConfig, log: str) -> dict[tuple[str, int], int]:
    """Each partition's next offset in the lake ({} before any table exists)."""
    from stepledger.errors import ViewStoreError
    from stepledger.readers.lake import connect_lake_reader

    try:
        con = connect_lake_reader(config, log)
    except ViewStoreError:
        return {}
    try:
        rows = con.execute("SELECT topic, partition, next_offset FROM offsets").fetchall()
    except duckdb.Error:
        return {}  # the schema is there, its first table set not yet
    finally:
        con.close()
    return {(str(t), int(p)): int(o) for t, p, o in rows}
