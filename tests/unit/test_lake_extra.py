"""Without the [lake] extra's DuckDB and extension wheels, a lake command is one line naming it."""

from __future__ import annotations

import duckdb
import pytest

from stepledger.cli import main
from stepledger.errors import ConfigError
from stepledger.readers.lake import LakeConfig, extension_directory, schema_name, table_name


@pytest.mark.parametrize(
    "args",
    [
        ["query", "--lake", "host=127.0.0.1 dbname=lake", "SELECT 1"],
        ["status", "--lake", "host=127.0.0.1 dbname=lake", "wf-1"],
        # Before any network: the broker named here does not exist.
        ["project", "--lake", "host=127.0.0.1 dbname=lake", "--bootstrap", "127.0.0.1:1"],
    ],
)
def test_a_lake_command_on_another_duckdb_is_one_line_naming_the_extra(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(duckdb, "__version__", "2.0.1")
    monkeypatch.setattr("sys.argv", ["stepledger", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 1
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "needs the [lake] extra (pip install 'stepledger[lake]')" in lines[0]
    assert "this environment has DuckDB 2.0.1" in lines[0]


def test_a_missing_extension_wheel_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duckdb, "__version__", "1.5.5")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="duckdb_extension_ducklake is not installed"):
        extension_directory()


def test_names_carry_the_step_log_and_the_partition() -> None:
    assert schema_name("stepledger.events") == "sl_stepledger_events"
    assert table_name("steps", "stepledger.events", "stepledger.events", 7) == "steps__p0007"
    assert table_name("steps", "stepledger.events", "other-log", 12) == "steps__other_log__p0012"


def test_the_attach_statement_quotes_the_catalog_and_never_writes_data_read_only() -> None:
    config = LakeConfig(catalog="host=h dbname=it's", data_path="s3://b/p/")
    assert config.attach_sql(read_only=False) == (
        "ATTACH 'ducklake:postgres:host=h dbname=it''s' AS lake (DATA_PATH 's3://b/p/')"
    )
    assert config.attach_sql(read_only=True) == (
        "ATTACH 'ducklake:postgres:host=h dbname=it''s' AS lake (READ_ONLY)"
    )
    assert config.secret_sql() is None
    keyed = LakeConfig(
        catalog="c", s3_endpoint="http://127.0.0.1:9000", s3_key_id="k", s3_secret="s"
    )
    secret = keyed.secret_sql()
    assert secret is not None
    assert "ENDPOINT '127.0.0.1:9000'" in secret and "USE_SSL false" in secret
