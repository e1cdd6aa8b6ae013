"""A fleet's permission table: each role gets its own fleet's names only, and never more."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepledger.config import load_settings
from stepledger.errors import ConfigError
from stepledger.fleets import ROLES, fleet_permissions, role_permissions, validate_fleet_name


def _covers(pattern: str, prefix: str, name: str) -> bool:
    return name.startswith(prefix) if pattern == "PREFIXED" else name == prefix


@pytest.mark.parametrize("other", ["ab", "a-b", "a_", "b"])
def test_no_acl_of_fleet_a_covers_a_name_of_another_fleet(other: str) -> None:
    names = [other, f"{other}.checkpoints", f"{other}.deadletters", f"{other}.projector"]
    names.append(f"{other}.budget")
    for permission in fleet_permissions("a"):
        for name in names:
            assert not _covers(permission.pattern, permission.name, name), permission


def test_a_dotted_name_is_refused_as_it_would_fall_under_another_fleets_prefix() -> None:
    with pytest.raises(ConfigError, match=r"no '\.'"):
        validate_fleet_name("a.x")


def test_only_the_checkpointer_writes_checkpoints_agents_and_the_inbox_the_budget() -> None:
    writers = {(p.principal, p.name) for p in fleet_permissions("f") if p.operation == "WRITE"}
    assert writers == {
        ("User:f.agent", "f"),
        ("User:f.recovery", "f"),
        ("User:f.inbox", "f"),
        ("User:f.projector", "f.deadletters"),
        ("User:f.recovery", "f.deadletters"),
        ("User:f.checkpointer", "f.checkpoints"),
        ("User:f.recovery", "f.recovery-state"),
        ("User:f.agent", "f.budget"),
        ("User:f.inbox", "f.budget"),
    }


def test_no_role_may_create_delete_alter_or_join_another_roles_group() -> None:
    for role in ROLES:
        permissions = role_permissions("f", role)
        assert {p.operation for p in permissions} <= {
            "READ",
            "WRITE",
            "DESCRIBE",
            "DESCRIBE_CONFIGS",
        }
        group_reads = {
            p.name for p in permissions if p.resource == "GROUP" and p.operation == "READ"
        }
        # The projector role joins the file projectors' group or the lake projectors'.
        own = {f"f.{role}", "f.lake-projector"} if role == "projector" else {f"f.{role}"}
        assert group_reads <= own, role
        prefixed = [p for p in permissions if p.pattern == "PREFIXED"]
        assert all(p.resource == "GROUP" and p.operation == "DESCRIBE" for p in prefixed)


def test_a_role_config_pins_its_fleet_against_flags_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "a-agent.toml"
    config.write_text('bootstrap = "127.0.0.1:1"\nfleet_id = "a"\nrole = "agent"\ntopic = "a"\n')
    assert load_settings(config_file=config, env={}).fleet_id == "a"
    with pytest.raises(ConfigError, match=r"fleet 'a'.s agent: fleet_id stays 'a'"):
        load_settings({"fleet_id": "b"}, config_file=config, env={})
    with pytest.raises(ConfigError, match="topic stays 'a'"):
        load_settings(config_file=config, env={"STEPLEDGER_TOPIC": "b"})
    same = load_settings({"fleet_id": "a"}, config_file=config, env={})
    assert same.role == "agent"
