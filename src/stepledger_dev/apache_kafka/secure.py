"""A secured cluster's settings: SASL/SCRAM-SHA-512 for clients, SASL/PLAIN between nodes.

What DESIGN.md ("Secured Apache Kafka") measured decides each choice here:
- the super user's SCRAM credentials exist only if ``kafka-storage format --add-scram`` wrote
  them (the Admin API creates every later user, and needs an authenticated super user);
- the controller listener is SASL/PLAIN with a password of its own: on PLAINTEXT its principal
  would be ``User:ANONYMOUS``, which must then be a super user, and anyone reaching the
  controller port would be one too;
- ``allow.everyone.if.no.acl.found=false``: with true, a principal no ACL names could write
  every topic no ACL names.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

#: The SASL mechanism clients authenticate with (SCRAM credentials live in the metadata log).
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The authorizer of a KRaft cluster (ACLs in the metadata log).
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
#: The client listener's name (and security protocol) on a secured cluster.
CLIENT_LISTENER = "SASL_PLAINTEXT"


def _password() -> str:
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Security:
    """The super user and the controllers' shared password of one secured cluster."""

    admin_user: str = "admin"
    admin_password: str = field(default_factory=_password, repr=False)
    controller_user: str = "controller"
    controller_password: str = field(default_factory=_password, repr=False)

    def client_settings(self) -> dict[str, str]:
        """The librdkafka settings of a client authenticated as the super user."""
        return {
            "security.protocol": CLIENT_LISTENER,
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": self.admin_user,
            "sasl.password": self.admin_password,
        }

    def format_arguments(self) -> list[str]:
        """What ``kafka-storage format`` adds so the super user exists from the first start."""
        return [
            "--add-scram",
            f"{SCRAM_MECHANISM}=[name={self.admin_user},password={self.admin_password}]",
        ]

    def server_settings(self, port: int, controller_port: int, host: str) -> dict[str, object]:
        """The ``server.properties`` keys that secure one node's listeners."""
        scram_login = "org.apache.kafka.common.security.scram.ScramLoginModule"
        plain_login = "org.apache.kafka.common.security.plain.PlainLoginModule"
        client = CLIENT_LISTENER.lower()
        return {
            "listeners": f"{CLIENT_LISTENER}://{host}:{port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"{CLIENT_LISTENER}://{host}:{port}",
            "inter.broker.listener.name": CLIENT_LISTENER,
            "listener.security.protocol.map": (
                f"CONTROLLER:SASL_PLAINTEXT,{CLIENT_LISTENER}:SASL_PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.{client}.sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.{client}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                f'{scram_login} required username="{self.admin_user}" '
                f'password="{self.admin_password}";'
            ),
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": (
                f'{plain_login} required username="{self.controller_user}" '
                f'password="{self.controller_password}" '
                f'user_{self.controller_user}="{self.controller_password}";'
            ),
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{self.admin_user};User:{self.controller_user}",
        }
