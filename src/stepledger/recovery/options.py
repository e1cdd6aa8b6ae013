"""How the recovery daemon runs: options built once at the edge (CLI or embedding program)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stepledger.config import Settings
from stepledger.kafka.consumer import GroupProtocol, Membership


@dataclass(frozen=True)
class DaemonOptions:
    """How the daemon runs."""

    state_dir: Path
    """Where the heartbeat file ``stepledger recover-health`` reads is written (the state
    itself is on the recovery changelog topic)."""
    group: str = ""
    """Consumer group; daemons in one group split the partitions (empty: the settings'
    ``recovery_group``, named after the step log)."""
    grace_s: float = 2.0
    """Extra wait after an intent's deadline before recovery acts (slow agents' margin)."""
    workers: int = 8
    """Resolutions run at once (hooks may block up to their tool's timeout)."""
    queue_per_worker: int = 32
    """Due steps handed to the pool ahead of the workers, so no worker waits for the loop."""
    checkpoint_interval_s: float = 0.5
    """How often the state is checkpointed while events flow."""
    retain_s: float = 86_400.0
    """How long a recovery decision is kept to judge a late outcome against it."""
    retry_base_s: float = 0.25
    """First back-off after a failed recovery attempt (doubling, capped by the timeout)."""
    batch_size: int = 1000
    """Records read per poll."""
    poll_timeout_s: float = 0.05
    """How long one poll waits for records."""
    drain_timeout_s: float = 30.0
    """How long a revocation or shutdown waits for running resolutions."""
    claim_timeout_s: float = 10.0
    """Longest a compensation waits to read its own claim back; past it, no hook runs."""
    health_interval_s: float = 1.0
    """How often the health file is rewritten."""
    session_timeout_s: float = 6.0
    """Consumer-group session timeout: how soon a dead daemon's partitions move (classic)."""
    instance_id: str | None = None
    """Static group membership: a restart within the session timeout moves no partition."""
    group_protocol: GroupProtocol | None = None
    """``classic`` (cooperative-sticky) or ``consumer`` (KIP-848); None: ``-X`` or classic."""
    consumer: dict[str, Any] = field(default_factory=dict)
    """Extra librdkafka consumer settings, applied last."""

    def for_settings(self, settings: Settings) -> DaemonOptions:
        """These options with the group named (the settings' when none was given)."""
        return self if self.group else replace(self, group=settings.recovery_group)

    def membership(self, client_id: str) -> Membership:
        """How the daemon takes part in its consumer group."""
        return Membership(
            group=self.group,
            session_timeout_s=self.session_timeout_s,
            protocol=self.group_protocol,
            instance_id=self.instance_id,
            client_id=client_id,
            extra=self.consumer,
        )

    @property
    def health_file(self) -> Path:
        """The JSON heartbeat ``stepledger recover-health`` reads."""
        return self.state_dir / f"health-{self.group}.json"
