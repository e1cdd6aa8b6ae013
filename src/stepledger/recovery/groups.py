"""Recovery daemons of another group on the same topic: each would decide every step again."""

from __future__ import annotations

import logging

from stepledger import wire
from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.kafka.describe import ClusterView, GroupMember

logger = logging.getLogger(__name__)


def warn_other_groups(settings: Settings, group: str) -> list[str]:
    """Warn loudly when recovery daemons of another group follow the same topic.

    Daemons split partitions only within one consumer group: two groups each own every
    partition, so each in-doubt step has two deciders (their claims are ordered by the log,
    but hooks are tried twice and every decision is contested).  Run one group per topic.
    Returns the other groups found (none where the broker cannot describe groups).
    """
    try:
        cluster = ClusterView(settings)
        ids = [g for g in cluster.group_ids(timeout=5) if g != group]
        described = cluster.members(ids, timeout=5)
        others = [g for g, members in described.items() if _recovery_on(members, settings.topic)]
    except BrokerError as exc:  # a broker that cannot list groups (the dev broker): no check
        logger.debug("consumer groups not checked", extra={"error": str(exc)})
        return []
    if others:
        logger.error(
            "other recovery groups follow this topic: each group decides every step again; "
            "run one recovery group per topic",
            extra={"topic": settings.topic, "groups": sorted(others), "group": group},
        )
    return others


def _recovery_on(members: list[GroupMember], topic: str) -> bool:
    """True when a recovery daemon (told by its client id) follows ``topic`` in the group."""
    return any(
        m.client_id.startswith(wire.RECOVERY_CLIENT_ID) and topic in m.topics for m in members
    )
