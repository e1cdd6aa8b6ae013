"""A secured stack gives each child its own role's config, never the super user's settings:
the chaos run's processes run with least privilege (``stepledger chaos --secure``)."""

from __future__ import annotations

import os
from pathlib import Path

from stepledger.config import Settings
from stepledger_dev.stack import LocalStack, StackOptions

ADMIN = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "admin", "sasl.password": "secret"}  # fmt: skip


def _stack(tmp_path: Path, secure: bool) -> LocalStack:
    stack = LocalStack(tmp_path, StackOptions(secure=secure))
    stack.settings = Settings(bootstrap="127.0.0.1:9092", topic="fa", fleet_id="fa", kafka=ADMIN)
    return stack


def test_each_child_of_a_secured_stack_gets_its_roles_config_and_no_admin_secret(
    tmp_path: Path,
) -> None:
    stack = _stack(tmp_path, secure=True)
    for role in ("agent", "projector", "recovery", "checkpointer"):
        env = stack.child_env(role=role)
        assert env["STEPLEDGER_CONFIG"] == str(tmp_path / "fleet" / f"fa-{role}.toml")
        assert "secret" not in env.values()
        assert not any(key.startswith("STEPLEDGER_KAFKA_SASL") for key in env)
    assert stack.child_env()["STEPLEDGER_CONFIG"].endswith("fa-agent.toml")


def test_an_open_stack_passes_its_settings_as_before(tmp_path: Path) -> None:
    env = _stack(tmp_path, secure=False).child_env(role="projector")
    assert env["STEPLEDGER_KAFKA_SASL_USERNAME"] == "admin"
    assert env.get("STEPLEDGER_CONFIG") == os.environ.get("STEPLEDGER_CONFIG")
