"""Random but reproducible step logs for projector tests: every kind of event and defect."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from stepledger.domain import events as ev
from stepledger.domain.enums import (
    CompensationStatus,
    EffectClass,
    OutcomeStatus,
    ResolutionPolicy,
    Source,
    Verdict,
    WorkflowStatus,
)
from stepledger.domain.factory import EventFactory
from stepledger.domain.ids import compensation_key, escalation_id, idempotency_key
from stepledger.domain.tools import Tool

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TOOLS = (
    Tool(name="pay", effect="idempotent", keyed=True),
    Tool(name="book", effect="compensatable", compensate=lambda a, k, r: None),
    Tool(name="mail", effect="irreversible", requires_approval=True),
    Tool(name="lookup", effect="read_only"),
)


class TickClock:
    """A deterministic clock advancing a random few milliseconds per event."""

    def __init__(self, rng: random.Random, start: datetime = T0) -> None:
        self.rng, self.now = rng, start

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=self.rng.randint(1, 40))
        return self.now


@dataclass
class _Workflow:
    """Builds one workflow's events, sometimes in ways the state machine must refuse."""

    rng: random.Random
    f: EventFactory
    workflow_id: str
    events: list[ev.Event] = field(default_factory=list)

    def emit(self, step_id: str | None, body: ev.Body, *qualifiers: object) -> ev.Event:
        event = self.f.envelope(self.workflow_id, step_id, body, *qualifiers)
        self.events.append(event)
        return event

    def build(self, steps: int) -> list[ev.Event]:
        read_only = self.rng.random() < 0.1
        self.events.append(
            self.f.workflow_started(
                self.workflow_id, name="job", attempt=1, read_only=read_only, max_attempts=3
            )
        )
        for seq in range(steps):
            self.step(f"s{seq}", seq, self.rng.choice(TOOLS))
            if self.rng.random() < 0.05:
                self.restart(read_only)
        self.finish()
        self.noise()
        return self.events

    def step(self, step_id: str, seq: int, tool: Tool) -> None:
        rng = self.rng
        if tool.requires_approval:
            self.emit(step_id, ev.ApprovalRequested(tool=tool.name, reason="pivot"))
            granted = rng.random() < 0.8
            self.emit(step_id, ev.ApprovalDecided(granted=granted, by="ops"))
            if not granted:
                return
        for attempt in range(1, 4):
            self.events.append(
                self.f.intent(
                    self.workflow_id, step_id, tool, {"i": seq}, sequence=seq, attempt=attempt
                )
            )
            if rng.random() < 0.12:
                self.in_doubt(step_id, tool, attempt)
                return
            status = rng.choices(list(OutcomeStatus), weights=(6, 3, 1))[0]
            self.outcome(step_id, attempt, status, Source.AGENT)
            if rng.random() < 0.05:
                self.outcome(
                    step_id, attempt, rng.choice(list(OutcomeStatus)), Source.RECOVERY_QUERY
                )
            if status is OutcomeStatus.SUCCEEDED:
                if tool.effect is EffectClass.COMPENSATABLE and rng.random() < 0.3:
                    self.compensate(step_id, Source.AGENT, tool, attempt)
                return
            if rng.random() < 0.4:
                return  # the agent gives up: the step stays failed / not happened

    def outcome(self, step_id: str, attempt: int, status: OutcomeStatus, source: Source) -> None:
        self.events.append(
            self.f.outcome(
                self.workflow_id,
                step_id,
                attempt=attempt,
                status=status,
                source=source,
                result={"n": attempt} if status is OutcomeStatus.SUCCEEDED else None,
                error="boom" if status is OutcomeStatus.FAILED else None,
            )
        )

    def in_doubt(self, step_id: str, tool: Tool, attempt: int) -> None:
        """Leave the intent open, or resolve it the way recovery or a human would."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:
            return
        policy = tool.resolution
        self.emit(step_id, ev.ResolutionAttempted(policy=policy, attempt=1, answer_json="{}"))
        if roll < 0.5:
            self.outcome(step_id, attempt, OutcomeStatus.SUCCEEDED, Source.RECOVERY_QUERY)
        elif roll < 0.7 and policy is ResolutionPolicy.COMPENSATE:
            self.compensate(step_id, Source.RECOVERY_COMPENSATE, tool, attempt)
        else:
            esc = escalation_id(self.workflow_id, step_id, "hooks_exhausted", attempt)
            self.emit(
                step_id,
                ev.StepAbandoned(
                    reason="hooks exhausted", escalation_id=esc, source=Source.RECOVERY
                ),
            )
            if rng.random() < 0.6:
                verdict = rng.choice([Verdict.HAPPENED, Verdict.NOT_HAPPENED, Verdict.COMPENSATED])
                self.emit(
                    step_id, ev.EscalationResolved(escalation_id=esc, verdict=verdict, by="ann")
                )

    def compensate(self, step_id: str, source: Source, tool: Tool, attempt: int) -> None:
        step_key = idempotency_key(self.workflow_id, step_id, tool.name, attempt)
        key = compensation_key(step_key)
        deadline = T0 + timedelta(days=1)
        self.emit(
            step_id,
            ev.CompensationIntended(
                idempotency_key=key, reason="undo", source=source, deadline=deadline
            ),
        )
        if self.rng.random() < 0.85:
            status = self.rng.choice(list(CompensationStatus))
            self.emit(
                step_id,
                ev.CompensationOutcome(
                    status=status,
                    source=source,
                    error="x" if status is CompensationStatus.FAILED else None,
                ),
            )

    def restart(self, read_only: bool) -> None:
        attempt = 2 + sum(1 for e in self.events if e.type in ("workflow_resumed",))
        if read_only:
            self.events.append(
                self.f.workflow_started(
                    self.workflow_id, name="job", attempt=attempt, read_only=True, max_attempts=3
                )
            )
        else:
            self.emit(None, ev.WorkflowResumed(attempt=attempt, reason="crash"))

    def finish(self) -> None:
        roll = self.rng.random()
        if roll < 0.6:
            status = self.rng.choice(list(WorkflowStatus))
            self.emit(None, ev.WorkflowFinished(status=status))
        elif roll < 0.75:
            esc = escalation_id(self.workflow_id, None, "attempts", 3)
            self.emit(
                None,
                ev.WorkflowDeadLettered(attempt=3, reason="too many attempts", escalation_id=esc),
            )
            if self.rng.random() < 0.5:
                self.emit(
                    None,
                    ev.EscalationResolved(escalation_id=esc, verdict=Verdict.CLEARED, by="ann"),
                )

    def noise(self) -> None:
        """Defects: outcomes with no intent, observed anomalies, duplicates, reordering."""
        rng = self.rng
        if rng.random() < 0.1:
            self.outcome("ghost", 1, OutcomeStatus.SUCCEEDED, Source.AGENT)
        if rng.random() < 0.1:
            self.emit(
                None,
                ev.AnomalyObserved(
                    kind="service_disagrees", detail="charge twice", source=Source.RECONCILE
                ),
            )
        for _ in range(rng.randint(0, 3)):
            if self.events:
                self.events.insert(rng.randrange(len(self.events) + 1), rng.choice(self.events))
        if rng.random() < 0.1 and len(self.events) > 3:
            i = rng.randrange(len(self.events) - 1)
            self.events[i], self.events[i + 1] = self.events[i + 1], self.events[i]


def random_log(seed: int, workflows: int, *, max_steps: int = 6, fleets: int = 2) -> list[ev.Event]:
    """A log of many workflows, interleaved as concurrent agents would write them."""
    rng = random.Random(seed)
    clock = TickClock(rng)
    per_workflow = []
    for i in range(workflows):
        f = EventFactory(f"fleet-{i % fleets}", f"agent-{i % 3}", clock)
        per_workflow.append(
            _Workflow(rng, f, f"wf-{seed}-{i:04d}").build(rng.randint(1, max_steps))
        )
    merged: list[ev.Event] = []
    queues = [list(events) for events in per_workflow]
    while queues:
        queue = rng.choice(queues)
        merged.append(queue.pop(0))
        if not queue:
            queues.remove(queue)
    return merged
