"""Tool spec validation, deterministic ids, redaction and settings precedence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepledger.config import Settings, load_settings, parse_kafka_options
from stepledger.domain import ids
from stepledger.domain.enums import ResolutionPolicy
from stepledger.domain.tools import NotFound, Tool
from stepledger.errors import ConfigError, ToolDefinitionError
from tests.unit.factories import factory, pay_tool


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"effect": "irreversible", "policy": "redrive"}, "whose repeat is safe"),
        ({"effect": "compensatable", "policy": "compensate"}, "needs a compensate hook"),
        ({"effect": "idempotent", "policy": "compensate"}, "needs a compensate hook"),
        ({"effect": "irreversible", "compensate": lambda a, k, r: 1}, "contradicts"),
        ({"read_only": True, "compensate": lambda a, k, r: 1}, "nothing to undo"),
        ({"effect": "idempotent", "policy": "query"}, "needs a query hook"),
        ({"effect": "read_only", "requires_approval": True}, "cannot require approval"),
        ({"effect": "idempotent", "timeout_s": 0}, "timeout_s"),
        ({"effect": "idempotent", "max_attempts": 0}, "max_attempts"),
        ({"effect": "sideways"}, "effect"),
    ],
)
def test_invalid_tools_are_refused_with_a_clear_message(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolDefinitionError, match=message):
        Tool(name="t", **kwargs)


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ToolDefinitionError) as info:
        Tool(name="t", policy="compensate", requires_approval=True, read_only=True)
    assert "compensate hook" in str(info.value) and "approval" in str(info.value)


def test_policies_default_from_the_two_properties() -> None:
    assert Tool(name="a").resolution is ResolutionPolicy.ESCALATE
    assert Tool(name="b", keyed=True).resolution is ResolutionPolicy.REDRIVE
    assert Tool(name="c", idempotent=True).resolution is ResolutionPolicy.REDRIVE
    undo = Tool(name="d", compensate=lambda a, k, r: 1)
    assert undo.resolution is ResolutionPolicy.COMPENSATE and undo.effect == "compensatable"
    both = Tool(name="e", keyed=True, compensate=lambda a, k, r: 1)
    assert both.resolution is ResolutionPolicy.REDRIVE and both.repeatable and both.undoable
    assert Tool(name="f", read_only=True).effect == "read_only"


def test_policies_default_from_effect() -> None:
    assert Tool(name="a", effect="irreversible").resolution is ResolutionPolicy.ESCALATE
    assert Tool(name="b", effect="idempotent").resolution is ResolutionPolicy.REDRIVE
    keyed = Tool(name="c", effect="irreversible", keyed=True, policy="redrive")
    assert keyed.resolution is ResolutionPolicy.REDRIVE


def test_tool_is_frozen() -> None:
    tool = Tool(name="a", effect="idempotent")
    with pytest.raises(Exception, match="frozen"):
        tool.name = "b"


def test_ids_are_deterministic_and_distinct() -> None:
    assert ids.idempotency_key("w", "s", "pay") == ids.idempotency_key("w", "s", "pay")
    assert ids.idempotency_key("w", "s", "pay") != ids.idempotency_key("w", "s2", "pay")
    assert ids.idempotency_key("w", "s", "pay", 2) != ids.idempotency_key("w", "s", "pay")
    assert ids.event_id("w", "s", "x", 1) != ids.event_id("w", "s", "x", 2)
    a, b = factory(), factory()
    tool = pay_tool(secret_args=frozenset({"card"}))
    first = a.intent("w", "s", tool, {"card": "4242", "n": 1}, sequence=0)
    again = b.intent("w", "s", tool, {"n": 1, "card": "4242"}, sequence=0)
    assert first.event_id == again.event_id
    assert first.body.idempotency_key == again.body.idempotency_key  # type: ignore[union-attr]


def test_secrets_are_never_recorded_in_clear() -> None:
    tool = pay_tool(secret_args=frozenset({"card"}))
    intent = factory().intent("w", "s", tool, {"card": "4242424242424242"}, sequence=0)
    text = intent.model_dump_json()
    assert "4242424242424242" not in text
    assert intent.body.arguments_json == '{"card":"[redacted]"}'  # type: ignore[union-attr]
    assert NotFound().detail == ""


def test_settings_precedence_flags_env_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[stepledger]\ntopic = "from-file"\nfleet_id = "file-fleet"\n'
        '[stepledger.kafka]\n"security.protocol" = "SSL"\n"client.id" = "file"\n'
    )
    env = {"STEPLEDGER_TOPIC": "from-env", "STEPLEDGER_KAFKA_CLIENT_ID": "env"}
    settings = load_settings({"bootstrap": "127.0.0.1:1234"}, env=env, config_file=config)
    assert settings.topic == "from-env" and settings.fleet_id == "file-fleet"
    assert settings.kafka == {"security.protocol": "SSL", "client.id": "env"}
    conf = settings.client_config()
    assert conf["bootstrap.servers"] == "127.0.0.1:1234" and conf["security.protocol"] == "SSL"
    flagged = load_settings({"kafka": parse_kafka_options(["client.id=flag"])}, env=env)
    assert flagged.kafka["client.id"] == "flag"


@pytest.mark.parametrize(
    "flags,message",
    [({"bootstrap": "nohost"}, "HOST:PORT"), ({"durable_timeout_s": -1}, "durable_timeout_s")],
)
def test_bad_settings_raise_config_error(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(flags, env={})


def test_bad_config_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("not = [valid")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(env={}, config_file=bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(env={}, config_file=tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="key=value"):
        parse_kafka_options(["novalue"])


def test_a_retired_setting_is_ignored_wherever_it_is_given(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A configuration written for an older release (the lingering client's settings in
    the environment, the file or code) still starts, with a warning naming the setting."""
    config = tmp_path / "c.toml"
    config.write_text('[stepledger]\ntopic = "t"\nbatch_from_in_flight = 8\n')
    env = {"STEPLEDGER_BATCH_LINGER_MS": "1", "STEPLEDGER_TOPIC": "from-env"}
    with caplog.at_level("WARNING", logger="stepledger.config"):
        settings = load_settings(env=env, config_file=config)
    assert settings.topic == "from-env"
    assert "batch_linger_ms" in caplog.text and "batch_from_in_flight" in caplog.text
    assert Settings(batch_linger_ms=0).topic == Settings().topic  # type: ignore[call-arg]
