"""The projection's own schema version: an older file is migrated, a newer one refused."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from stepledger.errors import ViewStoreError
from stepledger.projector.schema import ARROW, SCHEMA_VERSION, create_schema, table_ddl

_V1_ESCALATIONS = table_ddl("escalations").replace(
    'PRIMARY KEY ("workflow_id", "escalation_id")', 'PRIMARY KEY ("escalation_id")'
)
_ROW = "(?, 'step', ?, 's1', 'fleet', 'why', 'open', now(), NULL, NULL, NULL, NULL)"


def _version_one(path: Path) -> None:
    """A projection as stepledger wrote it before escalations were keyed by workflow."""
    con = duckdb.connect(str(path))
    assert 'escalation_id")' in _V1_ESCALATIONS
    con.execute(_V1_ESCALATIONS)
    con.execute("CREATE TABLE projector_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO projector_meta VALUES ('schema_version', '1')")
    con.execute(f"INSERT INTO escalations VALUES {_ROW}", ["esc-1", "wf-a"])
    con.close()


def test_a_version_one_projection_is_rekeyed_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "v1.duckdb"
    _version_one(path)
    con = duckdb.connect(str(path))
    create_schema(con)
    assert con.execute("SELECT escalation_id, workflow_id FROM escalations").fetchall() == [
        ("esc-1", "wf-a")
    ]
    # Two workflows may now hold one escalation id without overwriting each other.
    con.execute(f"INSERT OR REPLACE INTO escalations VALUES {_ROW}", ["esc-1", "wf-b"])
    assert con.execute("SELECT count(*) FROM escalations").fetchone() == (2,)
    assert con.execute(
        "SELECT value FROM projector_meta WHERE key = 'schema_version'"
    ).fetchone() == (str(SCHEMA_VERSION),)
    assert con.execute("SELECT count(*) FROM unresolved_escalations").fetchone() == (2,)
    create_schema(con)  # idempotent once migrated
    assert con.execute("SELECT count(*) FROM escalations").fetchone() == (2,)
    con.close()


@pytest.mark.parametrize("value", [str(SCHEMA_VERSION + 1), "not-a-number"])
def test_a_projection_this_code_cannot_know_is_refused_in_one_line(
    tmp_path: Path, value: str
) -> None:
    con = duckdb.connect(str(tmp_path / "new.duckdb"))
    con.execute("CREATE TABLE projector_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO projector_meta VALUES ('schema_version', ?)", [value])
    with pytest.raises(ViewStoreError, match="rebuild the projection") as caught:
        create_schema(con)
    assert "\n" not in str(caught.value)
    assert con.execute("SELECT count(*) FROM information_schema.tables").fetchone() == (1,)


def test_a_version_two_projection_gains_the_app_version_columns(tmp_path: Path) -> None:
    path = tmp_path / "v2.duckdb"
    con = duckdb.connect(str(path))
    before = table_ddl("steps").replace(', "app_version" VARCHAR', "")
    assert "app_version" not in before
    con.execute(before)
    con.execute("CREATE TABLE projector_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO projector_meta VALUES ('schema_version', '2')")
    create_schema(con)
    names = [row[0] for row in con.execute("DESCRIBE steps").fetchall()]
    assert names[-1] == "app_version" and names == list(ARROW["steps"].names)
    con.close()
