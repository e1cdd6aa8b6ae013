"""The projector into a DuckLake (real PostgreSQL catalog, S3 from moto, the test broker).

The lake is a second implementation of the projector's one store boundary, so the rows it
holds must be the file's rows: the same log projected both ways gives the same tables.
"""

from __future__ import annotations

from pathlib import Path

from stepledger.config import Settings
from stepledger.readers.lake import LakeConfig, connect_lake_reader
from tests.integration.projector_helpers import produce_events, projecting
from tests.lake.conftest import lake_contents
from tests.unit.projector_harness import table_contents
from tests.unit.projector_logs import random_log


def test_the_lake_holds_what_the_file_holds(
    settings: Settings, lake: LakeConfig, tmp_path: Path
) -> None:
    log = random_log(7, 40)
    sent = produce_events(settings, log)
    db = tmp_path / "p.duckdb"
    with projecting(settings, db) as daemon:
        daemon.wait_received(sent)
    with projecting(settings, tmp_path / "unused.duckdb", lake=lake, group="lake-a") as daemon:
        daemon.wait_received(sent)
    con = connect_lake_reader(lake, settings.topic)
    try:
        in_lake = lake_contents(con)
        offsets = con.execute("SELECT sum(next_offset) FROM offsets").fetchone()
    finally:
        con.close()
    assert in_lake == table_contents(db)
    assert offsets is not None and offsets[0] == sent
