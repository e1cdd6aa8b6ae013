"""Recovery daemons of another group on the same topic: each would decide every step again."""

from __future__ import annotations

import logging
from typing import Any

from stepledger import wire
from stepledger.config import Settings
from stepledger.kafka import admin

logger = logging.getLogger(__name__)
CLIENT_ID = wire.RECOVERY_CLIENT_ID
"""The client id of every recovery daemon's consumer (how other groups' daemons are told)."""


def warn_other_groups(settings: Settings, group: str) -> list[str]:
    """Warn loudly when recovery daemons of another group follow the same topic.

    Daemons split partitions only within one consumer group: two groups each own every
    partition, so each in-doubt step has two deciders (their claims are ordered by the log,
    but hooks are tried twice and every decision is contested).  Run one group per topic.
    Returns the other groups found (none where the broker cannot describe groups).
    """
    try:
        client = admin(settings)
        listed = client.list_consumer_groups(request_timeout=5).result(timeout=10)
        ids = [g.group_id for g in listed.valid if g.group_id != group]
        if not ids:
            return []
        described = client.describe_consumer_groups(ids, request_timeout=5)
        others = []
        for group_id, future in described.items():
            members = future.result(timeout=10).members
            if any(_recovery_on(m, settings.topic) for m in members):
                others.append(group_id)
    except Exception as exc:  # a broker that cannot list groups (the dev broker): no check
        logger.debug("consumer groups not checked", extra={"error": str(exc)})
        return []
    if others:
        logger.error(
            "other recovery groups follow this topic: each group decides every step again; "
            "run one recovery group per topic",
            extra={"topic": settings.topic, "groups": sorted(others), "group": group},
        )
    return others


def _recovery_on(member: Any, topic: str) -> bool:
    if not str(member.client_id or "").startswith(CLIENT_ID):
        return False
    assignment = getattr(member, "assignment", None)
    partitions = getattr(assignment, "topic_partitions", None) or []
    return any(tp.topic == topic for tp in partitions)
