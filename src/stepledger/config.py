"""Settings, built once at the edge from flags, ``STEPLEDGER_*`` environment and a config file.

Precedence: explicit flags > environment > config file (TOML) > defaults.  librdkafka
settings pass through untouched: ``[kafka]`` in the file, ``STEPLEDGER_KAFKA_<KEY>``
(``STEPLEDGER_KAFKA_SECURITY_PROTOCOL=SASL_SSL`` -> ``security.protocol``) or ``-X key=value``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from stepledger import wire
from stepledger.domain.secrets import MIN_KEY_LENGTH
from stepledger.domain.usage import PriceTable, price_table
from stepledger.errors import ConfigError
from stepledger.fleets.permissions import Role as FleetRole

ENV_PREFIX = "STEPLEDGER_"
KAFKA_ENV_PREFIX = "STEPLEDGER_KAFKA_"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


class Settings(BaseModel):
    """Everything a stepledger process needs to talk to the event log."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = DEFAULT_BOOTSTRAP
    """Kafka bootstrap servers, HOST:PORT[,HOST:PORT]."""
    topic: str = wire.STEP_LOG_TOPIC
    """The step-log topic."""
    dlq_topic: str = wire.derived_name(wire.STEP_LOG_TOPIC, wire.DEAD_LETTER_ROLE)
    """Where undecodable or invalid input goes, with the reason in headers (default:
    ``<topic>.deadletters``)."""
    checkpoint_topic: str = wire.derived_name(wire.STEP_LOG_TOPIC, wire.CHECKPOINT_ROLE)
    """The compacted topic of workflow checkpoints, partitioned like the step log (default:
    ``<topic>.checkpoints``)."""
    recovery_state_topic: str = wire.derived_name(wire.STEP_LOG_TOPIC, wire.RECOVERY_STATE_ROLE)
    """The compacted topic of the recovery daemons' per-partition state, their one store
    (default: ``<topic>.recovery-state``)."""
    budget_topic: str = wire.derived_name(wire.STEP_LOG_TOPIC, wire.BUDGET_ROLE)
    """The one-partition topic whose order decides the fleets' model budgets (default:
    ``<topic>.budget``)."""
    projector_group: str = wire.derived_name(wire.STEP_LOG_TOPIC, wire.PROJECTOR_ROLE)
    """The projector daemons' consumer group (default: ``<topic>.projector``)."""
    lake_projector_group: str = wire.derived_name(wire.STEP_LOG_TOPIC, wire.LAKE_PROJECTOR_ROLE)
    """The consumer group of the projectors into a lake (default: ``<topic>.lake-projector``)."""
    recovery_group: str = wire.derived_name(wire.STEP_LOG_TOPIC, wire.RECOVERY_ROLE)
    """The recovery daemons' consumer group (default: ``<topic>.recovery``)."""
    fleet_id: str = "default"
    """The fleet every event of this process is tagged with."""
    role: FleetRole | None = None
    """The fleet role these credentials are for (``fleet create`` writes it): it names the
    role in a refusal's line, and the config file that sets it pins the fleet's names."""
    producer_id: str = Field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    """The producing process, recorded in every event."""
    app_version: str | None = Field(default=None, min_length=1, max_length=200)
    """Your application's version (a release, a commit): every claim of a workflow records
    it beside stepledger's, so a resume by other code names both (docs/agents.md)."""
    schema_registry_url: str | None = None
    """Confluent Schema Registry URL; when unset, values use Avro single-object encoding."""
    durable_timeout_s: float = Field(default=10.0, gt=0)
    """How long a durable append waits for the broker's acknowledgement before failing."""
    startup_wait_s: float = Field(default=0.0, ge=0, le=3600)
    """How long a daemon waits at start for an unreachable broker (0: fail at once, one line)."""
    kafka: dict[str, str] = Field(default_factory=dict)
    """Extra librdkafka settings (SASL, TLS, ...), passed through untouched."""
    ack_journal: str | None = None
    """A file to which the id of every acknowledged event is appended (for verification)."""
    redaction_key: SecretStr | None = Field(default=None, min_length=MIN_KEY_LENGTH)
    """Keys the HMAC recorded for secret arguments (and in each call's fingerprint); unset,
    they are a fixed marker only, and a tool that requires approval with secret arguments
    is refused."""
    projection: str | None = None
    """The projector's DuckDB file: the SDK opens workflows from its snapshot plus a tail."""
    lake: str | None = None
    """The DuckLake the projectors commit to, by its PostgreSQL catalog (a libpq DSN or a
    ``postgresql://`` URL; the bucket's key from the AWS variables): ``project`` writes it,
    and the inbox and the CLI's workflow commands read the projection there."""

    @model_validator(mode="before")
    @classmethod
    def _derive_names(cls, values: Any) -> Any:
        """Drop retired settings; name every state topic and group after the step log
        unless one is given."""
        if not isinstance(values, dict):
            return values
        values = _without_retired(values)
        topic = values.get("topic") or wire.STEP_LOG_TOPIC
        missing = {
            name: wire.derived_name(str(topic), role)
            for name, role in DERIVED_NAMES.items()
            if not values.get(name)
        }
        return {**values, **missing} if missing else values

    @field_validator(
        "topic", "dlq_topic", "checkpoint_topic", "recovery_state_topic", "budget_topic"
    )
    @classmethod
    def _topic_name(cls, value: str) -> str:
        # Kafka refuses other names only when a topic is created or read: say it at start.
        if not _TOPIC_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)")
        return value

    def group(self, role: str) -> str:
        """The group id this deployment's clients of ``role`` use (a ``wire.*_ROLE``)."""
        return wire.derived_name(self.topic, role)

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"expected HOST:PORT, got {server!r}")
        return value

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """Render the librdkafka config: bootstrap + pass-through settings + overrides."""
        return {
            "bootstrap.servers": self.bootstrap,
            "logger": librdkafka_logger(),
            **self.kafka,
            **overrides,
        }

    def quick_connect(self) -> dict[str, Any]:
        """Overrides for a short-lived client that asks one thing and closes (an admin
        listing, a point read): ``reconnect.backoff.ms`` 20 unless the settings give one.

        librdkafka drops its bootstrap connection once the metadata names the brokers, and
        waits half librdkafka's default backoff before it connects to a named one, which
        delayed every new client's first metadata request (docs/benchmarks.md, appendix).
        Long-lived clients (producers, group members) keep librdkafka's default.
        """
        if "reconnect.backoff.ms" in self.kafka:
            return {}
        return {"reconnect.backoff.ms": _RECONNECT_BACKOFF_MS}


#: The settings named after the step log unless given, and the role each is named for.
DERIVED_NAMES = {
    "dlq_topic": wire.DEAD_LETTER_ROLE,
    "checkpoint_topic": wire.CHECKPOINT_ROLE,
    "recovery_state_topic": wire.RECOVERY_STATE_ROLE,
    "budget_topic": wire.BUDGET_ROLE,
    "projector_group": wire.PROJECTOR_ROLE,
    "lake_projector_group": wire.LAKE_PROJECTOR_ROLE,
    "recovery_group": wire.RECOVERY_ROLE,
}
#: Settings no longer read: given (file, environment, flags or code), each is dropped with a
#: warning, so a configuration written for an older release still starts.
_ONE_CLIENT = "every step-log record leaves through one client, none lingers"
RETIRED_SETTINGS = {"batch_linger_ms": _ONE_CLIENT, "batch_from_in_flight": _ONE_CLIENT}
_PINNED_TOPICS = ("topic", *DERIVED_NAMES)
#: What Kafka accepts as a topic name (``kafka.common.internals.Topic``).
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
#: The first reconnect backoff of short-lived clients (see :meth:`Settings.quick_connect`).
_RECONNECT_BACKOFF_MS = 20


def _without_retired(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without the retired settings, each one given logged as a warning."""
    retired = [name for name in values if name in RETIRED_SETTINGS]
    for name in retired:
        logging.getLogger(__name__).warning(
            "setting %s is no longer read (%s)", name, RETIRED_SETTINGS[name]
        )
    return {k: v for k, v in values.items() if k not in RETIRED_SETTINGS} if retired else values


def librdkafka_logger() -> logging.Logger:
    """The logger librdkafka's own messages go to (silent unless a daemon configures logging).

    Without it librdkafka prints every failed connection attempt to stderr, which would
    bury a command's one-line error.
    """
    logger = logging.getLogger("stepledger.librdkafka")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Build settings from flags, environment and an optional TOML file (in that precedence)."""
    env = os.environ if env is None else env
    config_file = config_file or env.get(f"{ENV_PREFIX}CONFIG")
    values: dict[str, Any] = _from_file(Path(config_file)) if config_file else {}
    kafka = dict(values.pop("kafka", {}) or {})
    pinned = dict(values) if values.get("role") else {}
    values.update(_from_env(env))
    kafka.update(_kafka_from_env(env))
    flag_values = {k: v for k, v in (flags or {}).items() if v is not None}
    kafka.update(flag_values.pop("kafka", {}) or {})
    values.update(flag_values)
    _check_pinned(pinned, values)
    try:
        return Settings(**values, kafka={str(k): str(v) for k, v in kafka.items()})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from None


#: What a fleet role's config file pins: its fleet and the names its ACLs cover.
PINNED_BY_ROLE = ("fleet_id", "role", *_PINNED_TOPICS)


def _check_pinned(pinned: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """Refuse a flag or variable that would move a fleet role's config to other names."""
    for name in PINNED_BY_ROLE:
        if name in pinned and str(values.get(name)) != str(pinned[name]):
            raise ConfigError(
                f"the config file is fleet {pinned.get('fleet_id')!r}'s {pinned['role']}: "
                f"{name} stays {pinned[name]!r} (given {values.get(name)!r}); use another "
                "fleet's config file"
            )


def parse_kafka_options(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Parse ``key=value`` librdkafka options given as ``-X`` flags."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected -X key=value, got {pair!r}")
        options[key.strip()] = value
    return options


def config_text(values: Mapping[str, str], kafka: Mapping[str, str]) -> str:
    """A config file (TOML) that :func:`load_settings` reads back as ``values`` and ``kafka``."""
    lines = [f"{key} = {_toml_string(value)}" for key, value in values.items()]
    if kafka:
        lines += ["", "[kafka]"]
        lines += [f"{_toml_string(key)} = {_toml_string(value)}" for key, value in kafka.items()]
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (it may hold a password)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # An existing file keeps its mode through O_CREAT: narrow it before writing.
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path


def _toml_string(value: str) -> str:
    # A TOML basic string escapes as JSON does for the characters a setting holds.
    return json.dumps(value, ensure_ascii=False)


def _from_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not text (TOML must be UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return dict(data.get("stepledger", data))


def load_prices(path: str | Path) -> PriceTable:
    """The operator's model price table from a TOML file (``[models."NAME"]`` tables).

    Raises ConfigError for a file that cannot be read or a table that is not a price table.
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read price table {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"price table {path} is not valid TOML: {exc}") from None
    return price_table(data)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    fields = (set(Settings.model_fields) | set(RETIRED_SETTINGS)) - {"kafka"}
    found = {}
    for key, value in env.items():
        if key.startswith(ENV_PREFIX) and not key.startswith(KAFKA_ENV_PREFIX):
            name = key[len(ENV_PREFIX) :].lower()
            if name in fields:
                found[name] = value
    return found


def _kafka_from_env(env: Mapping[str, str]) -> dict[str, str]:
    return {
        key[len(KAFKA_ENV_PREFIX) :].lower().replace("_", "."): value
        for key, value in env.items()
        if key.startswith(KAFKA_ENV_PREFIX)
    }
