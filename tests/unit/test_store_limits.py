"""The projection store's bounds: a memory limit, and snapshots that never share a temp name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stepledger.projector.snapshot import publish_snapshot
from stepledger.projector.store import ProjectionStore


def test_the_store_has_a_bounded_configurable_memory_limit(tmp_path: Path) -> None:
    with ProjectionStore(tmp_path / "a.duckdb") as store:
        default = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
    with ProjectionStore(tmp_path / "b.duckdb", memory_limit="256MB") as store:
        small = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert default == ("953.6 MiB",)  # 1GB
    assert small == ("244.1 MiB",)  # 256MB


def test_concurrent_snapshots_use_distinct_temporary_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources: list[str] = []
    real = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        sources.append(str(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    with ProjectionStore(tmp_path / "ledger.duckdb") as store:
        publish_snapshot(store)
        publish_snapshot(store)
    assert len(set(sources)) == 2 and all(s.endswith(".partial") for s in sources)
