"""The invariants a chaos run is judged by: pure checks over the log and the services' effects."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from stepledger.domain.enums import Source
from stepledger.domain.events import (
    CompensationIntended,
    Event,
    StepAbandoned,
    StepIntended,
    StepOutcome,
)
from stepledger.domain.ids import compensation_key
from stepledger.domain.state import RunStatus, StepState, StepStatus, WorkflowState, replay

#: The service effect kind each example tool's call produces, and its compensation's.
EFFECT_KIND = {"payments.charge": "charge", "bookings.book": "booking"}
COMPENSATION_KIND = {"bookings.book": "cancel", "payments.charge": "refund"}
#: Compensations the service counts under their own key (a refund is its own transaction).
OWN_KEY_COMPENSATIONS = {"payments.charge"}
UNKEYED_TOOLS = {"email.send"}


@dataclass(frozen=True)
class InvariantViolation:
    """One broken invariant, with the workflow it concerns."""

    invariant: str
    workflow_id: str | None
    detail: str


@dataclass
class Evidence:
    """What a run left behind, gathered after everything quiesced."""

    events: list[Event]
    acked_event_ids: set[str] = field(default_factory=set)
    effects: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    charges_by_workflow: Mapping[str, int] = field(default_factory=dict)
    emails_by_workflow: Mapping[str, int] = field(default_factory=dict)
    captured_by_workflow: Mapping[str, int] = field(default_factory=dict)
    """Charges still captured (not refunded) per customer, from the payments service."""
    confirmed_bookings: Mapping[str, int] = field(default_factory=dict)
    """Bookings still confirmed (not cancelled) per booking key, from the bookings service."""
    projection_diff: list[str] = field(default_factory=list)
    undecodable: int = 0
    replays_from_zero: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    """Per daemon role, partition -> times a member replayed it from offset 0 (no state)."""
    partitions: int = 0
    """Partitions whose replays are checked (0: unchecked, as with one daemon of each kind)."""
    recovery_producers: frozenset[str] = frozenset()
    """The producer ids (``host:pid``) the recovery daemon processes appended under."""
    no_shared_state: bool = False
    """Each projector has a directory of its own: a partition is replayed from offset 0 by
    every member that takes it without a shard of it (once per member, not once per run)."""
    projector_replays_by_member: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    """Per projector member, partition -> times it replayed it from offset 0."""
    lake: bool = False
    """The projectors commit to one lake: each partition is read from offset 0 once, by its
    first owner, whichever state directory a later owner has."""


def workflows_of(events: Iterable[Event]) -> dict[str, WorkflowState]:
    """Fold the log into one state per workflow (log order within each workflow)."""
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        grouped[event.workflow_id].append(event)
    return {wf: replay(wf, evs) for wf, evs in grouped.items()}


def check_all(evidence: Evidence) -> list[InvariantViolation]:
    """Every violation of every invariant."""
    workflows = workflows_of(evidence.events)
    keys_by_step = _keys_by_step(evidence.events)
    violations = list(lost_acknowledged(evidence))
    for wf in workflows.values():
        violations += unresolved(wf)
        violations += resumption_limit(wf)
        for step in wf.steps.values():
            keys = keys_by_step.get((wf.workflow_id, step.step_id), [])
            violations += keyed_effects(wf.workflow_id, step, keys, evidence.effects)
            violations += compensation_effects(wf.workflow_id, step, keys, evidence.effects)
        violations += unkeyed_effects(wf, evidence.emails_by_workflow)
        violations += charges_per_workflow(wf, evidence.charges_by_workflow)
        violations += compensated_leaves_nothing_standing(wf, evidence, keys_by_step)
    violations += [
        InvariantViolation("projection_equals_rebuild", None, d) for d in evidence.projection_diff
    ]
    violations += decided_by_one_daemon(evidence.events, evidence.recovery_producers)
    if evidence.no_shared_state and not evidence.lake:
        replays = evidence.replays_from_zero
        violations += replayed_from_zero_once(replays, evidence.partitions, ("recovery",))
        violations += replayed_once_per_member(
            evidence.projector_replays_by_member, evidence.partitions
        )
    else:
        violations += replayed_from_zero_once(evidence.replays_from_zero, evidence.partitions)
    if evidence.undecodable:
        violations.append(
            InvariantViolation("log_decodes", None, f"{evidence.undecodable} undecodable records")
        )
    return violations


def lost_acknowledged(evidence: Evidence) -> list[InvariantViolation]:
    """An event an agent saw acknowledged must be in the log."""
    present = {e.event_id for e in evidence.events}
    return [
        InvariantViolation(
            "no_acknowledged_event_lost", None, f"acknowledged event {eid} not in the log"
        )
        for eid in sorted(evidence.acked_event_ids - present)
    ]


def unresolved(wf: WorkflowState) -> list[InvariantViolation]:
    """Every intent ends resolved or escalated; no compensation is left running."""
    return [
        InvariantViolation(
            "every_intent_resolved_or_escalated",
            wf.workflow_id,
            f"step {s.step_id} ({s.tool}) is still {s.status.value}",
        )
        for s in wf.steps.values()
        if s.status in (StepStatus.INTENDED, StepStatus.COMPENSATING)
    ]


def resumption_limit(wf: WorkflowState) -> list[InvariantViolation]:
    """No workflow runs past its limit: past it, it is dead-lettered and stays so."""
    found = []
    if wf.attempt > wf.max_attempts and wf.status is not RunStatus.DEAD_LETTERED:
        detail = f"attempt {wf.attempt} of {wf.max_attempts} without a dead letter"
        found.append(InvariantViolation("resumption_bounded", wf.workflow_id, detail))
    found += [
        InvariantViolation("resumption_bounded", wf.workflow_id, a.detail)
        for a in wf.anomalies
        if a.kind == "run_while_dead_lettered"
    ]
    return found


def keyed_effects(
    workflow_id: str, step: StepState, keys: list[str], effects: Mapping[str, Mapping[str, int]]
) -> list[InvariantViolation]:
    """A keyed tool's effect happens at most once per key, and exactly as the ledger says."""
    kind = EFFECT_KIND.get(step.tool)
    if kind is None:
        return []
    counts = effects.get(kind, {})
    found = []
    for key in keys:
        n = counts.get(key, 0)
        if n > 1:
            found.append(
                _v("keyed_effect_exactly_once", workflow_id, step, f"{n} {kind}s for {key}")
            )
        elif key != step.idempotency_key and n:
            found.append(
                _v(
                    "keyed_effect_exactly_once",
                    workflow_id,
                    step,
                    f"earlier attempt's key {key} has an effect the ledger judged away",
                )
            )
    latest = counts.get(step.idempotency_key, 0)
    expected = {StepStatus.SUCCEEDED: 1, StepStatus.NOT_HAPPENED: 0, StepStatus.FAILED: 0}
    want = expected.get(step.status)
    if want is not None and latest != want:
        found.append(
            _v(
                "keyed_effect_exactly_once",
                workflow_id,
                step,
                f"ledger says {step.status.value}, service has {latest} {kind}(s)",
            )
        )
    return found


def compensation_effects(
    workflow_id: str, step: StepState, keys: list[str], effects: Mapping[str, Mapping[str, int]]
) -> list[InvariantViolation]:
    """A compensation takes effect at most once, and only where there was something to undo."""
    kind = COMPENSATION_KIND.get(step.tool)
    if kind is None:
        return []
    done, by_undo_key = effects.get(EFFECT_KIND[step.tool], {}), effects.get(kind, {})
    undone = {key: by_undo_key.get(_undo_key(step.tool, key), 0) for key in keys}
    found = []
    for key in keys:
        if undone.get(key, 0) > 1:
            found.append(
                _v("compensation_at_most_once", workflow_id, step, f"{undone[key]} {kind}s")
            )
    if step.status is StepStatus.SUCCEEDED and undone.get(step.idempotency_key, 0):
        # A compensation that lost the race to another decision must never have run.
        found.append(
            _v(
                "effects_follow_the_first_decision",
                workflow_id,
                step,
                f"ledger says succeeded, service has {undone[step.idempotency_key]} {kind}(s)",
            )
        )
    if step.status is StepStatus.COMPENSATED:
        key = step.idempotency_key
        if undone.get(key, 0) != done.get(key, 0):
            found.append(
                _v(
                    "compensation_at_most_once",
                    workflow_id,
                    step,
                    f"compensated: {done.get(key, 0)} effect(s) but {undone.get(key, 0)} undone",
                )
            )
    return found


def unkeyed_effects(wf: WorkflowState, emails: Mapping[str, int]) -> list[InvariantViolation]:
    """An unkeyed irreversible effect is never repeated: at most one per workflow."""
    sent = emails.get(wf.workflow_id, 0)
    steps = [s for s in wf.steps.values() if s.tool in UNKEYED_TOOLS]
    found = []
    if sent > 1:
        found.append(
            InvariantViolation("unkeyed_effect_at_most_once", wf.workflow_id, f"{sent} emails")
        )
    for step in steps:
        if step.status is StepStatus.SUCCEEDED and sent != 1:
            found.append(
                _v(
                    "unkeyed_effect_at_most_once",
                    wf.workflow_id,
                    step,
                    f"ledger says sent, service has {sent}",
                )
            )
        if step.status is StepStatus.NOT_HAPPENED and sent:
            found.append(
                _v(
                    "unkeyed_effect_at_most_once",
                    wf.workflow_id,
                    step,
                    "ledger says not sent, service sent it",
                )
            )
    return found


def charges_per_workflow(wf: WorkflowState, charges: Mapping[str, int]) -> list[InvariantViolation]:
    """Whatever keys were used, a workflow is charged at most once, and once if it says so.

    This catches a tool that breaks its key (a re-drive under a fresh key), which per-key
    counts cannot see.
    """
    found = []
    charged = charges.get(wf.workflow_id, 0)
    if charged > 1:
        found.append(
            InvariantViolation("keyed_effect_exactly_once", wf.workflow_id, f"charged {charged}x")
        )
    for step in wf.steps.values():
        if step.tool == "payments.charge" and step.status is StepStatus.SUCCEEDED and charged != 1:
            found.append(
                _v(
                    "keyed_effect_exactly_once",
                    wf.workflow_id,
                    step,
                    f"ledger says charged, service has {charged} charge(s)",
                )
            )
    return found


def compensated_leaves_nothing_standing(
    wf: WorkflowState, evidence: Evidence, keys_by_step: Mapping[tuple[str, str], list[str]]
) -> list[InvariantViolation]:
    """A workflow that ended ``compensated`` has no effect left standing, by the services' state.

    A charge still captured (not refunded), a booking still confirmed (not cancelled) under
    any key the workflow used, or an email sent (it cannot be undone) all contradict it.
    """
    if wf.status is not RunStatus.COMPENSATED:
        return []
    standing = []
    if n := evidence.captured_by_workflow.get(wf.workflow_id, 0):
        standing.append(f"{n} charge(s) captured, not refunded")
    for step in wf.steps.values():
        keys = keys_by_step.get((wf.workflow_id, step.step_id), [])
        if step.tool == "bookings.book" and any(evidence.confirmed_bookings.get(k) for k in keys):
            standing.append(f"booking of step {step.step_id} still confirmed")
    if n := evidence.emails_by_workflow.get(wf.workflow_id, 0):
        standing.append(f"{n} email(s) sent")
    return [
        InvariantViolation("compensated_leaves_nothing_standing", wf.workflow_id, what)
        for what in standing
    ]


def decided_by_one_daemon(
    events: Iterable[Event], daemons: frozenset[str]
) -> list[InvariantViolation]:
    """Each attempt of a step is decided by at most one recovery daemon process, once.

    A decision is an outcome, a compensation claim or an abandonment appended by a daemon
    (``daemons``: their producer ids); an abandonment after the attempt's decision only
    escalates a conflict.  Two decision records for one attempt (even with one event id)
    mean two daemons judged the step: the fence failed, or a restart decided it again.
    """
    return [
        InvariantViolation(
            "in_doubt_step_decided_once",
            wf,
            f"step {step} attempt {attempt}: {len(found)} decisions ({'; '.join(found)})",
        )
        for (wf, step, attempt), found in sorted(daemon_decisions(events, daemons).items())
        if len(found) > 1
    ]


def daemon_decisions(
    events: Iterable[Event], daemons: frozenset[str]
) -> dict[tuple[str, str, int], list[str]]:
    """The decisions recovery daemons appended, by (workflow, step, attempt), in log order."""
    decided: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    attempts: dict[tuple[str, str], int] = {}
    for event in events:
        body, step_id = event.body, event.step_id
        if step_id is None:
            continue
        if isinstance(body, StepIntended):
            attempts[(event.workflow_id, step_id)] = body.attempt
            continue
        attempt = attempts.get((event.workflow_id, step_id), 1)
        key = (event.workflow_id, step_id, attempt)
        if event.producer_id not in daemons or not _decides(body, already=bool(decided[key])):
            continue
        decided[key].append(f"{body.type} by {event.producer_id}")
    return {key: found for key, found in decided.items() if found}


def _decides(body: object, *, already: bool) -> bool:
    if isinstance(body, StepOutcome | CompensationIntended):
        return body.source is not Source.AGENT
    return isinstance(body, StepAbandoned) and body.source is not Source.AGENT and not already


def replayed_from_zero_once(
    replays: Mapping[str, Mapping[int, int]],
    partitions: int,
    roles: tuple[str, ...] = ("projector", "recovery"),
) -> list[InvariantViolation]:
    """Each partition is replayed from offset 0 once per daemon kind: only while it has no state.

    In a run whose shards and checkpoints start empty and are never removed, a second replay
    means a member ignored the state its predecessor left.
    """
    return [
        InvariantViolation(
            "replayed_from_zero_only_without_state",
            None,
            f"{role}: partition {p} replayed from offset 0 {replays.get(role, {}).get(p, 0)} "
            f"time(s), expected once",
        )
        for role in roles
        for p in range(partitions)
        if replays.get(role, {}).get(p, 0) != 1
    ]


def replayed_once_per_member(
    by_member: Mapping[str, Mapping[int, int]], partitions: int
) -> list[InvariantViolation]:
    """Without a shared volume: each member replays a partition from 0 at most once.

    A member keeps the shard it built in its own directory, so taking the partition again
    continues from that shard; and every partition was replayed by some member.
    """
    found = [
        InvariantViolation(
            "replayed_from_zero_only_without_state",
            None,
            f"projector {member}: partition {p} replayed from offset 0 {n} time(s), "
            "expected at most once",
        )
        for member, counts in sorted(by_member.items())
        for p, n in sorted(counts.items())
        if n > 1
    ]
    found += [
        InvariantViolation(
            "replayed_from_zero_only_without_state",
            None,
            f"projector: partition {p} never replayed from offset 0 by any member",
        )
        for p in range(partitions)
        if not any(counts.get(p, 0) for counts in by_member.values())
    ]
    return found


def _undo_key(tool: str, key: str) -> str:
    return compensation_key(key) if tool in OWN_KEY_COMPENSATIONS else key


def _keys_by_step(events: Iterable[Event]) -> dict[tuple[str, str], list[str]]:
    keys: dict[tuple[str, str], list[str]] = defaultdict(list)
    for event in events:
        body = event.body
        if isinstance(body, StepIntended) and event.step_id is not None:
            seen = keys[(event.workflow_id, event.step_id)]
            if body.idempotency_key not in seen:
                seen.append(body.idempotency_key)
    return keys


def _v(invariant: str, workflow_id: str, step: StepState, detail: str) -> InvariantViolation:
    return InvariantViolation(
        invariant, workflow_id, f"step {step.step_id} ({step.tool}): {detail}"
    )
