"""The chaos harness's judges: each invariant flags what breaks it and passes what keeps it."""

from __future__ import annotations

from dataclasses import replace

import duckdb

from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source, WorkflowStatus
from stepledger.domain.tools import Found, Tool
from stepledger_dev.chaos.analyst import read_cut
from stepledger_dev.chaos.invariants import (
    Evidence,
    check_all,
    daemon_decisions,
    decided_by_one_daemon,
    replayed_from_zero_once,
    replayed_once_per_member,
)
from stepledger_dev.chaos.lake_run import analyst_violations
from stepledger_dev.chaos.plan import SCALE_FAULTS, CrashPoint, make_plan
from tests.unit.factories import factory

F = factory()
CHARGE = Tool(
    name="payments.charge",
    effect="idempotent",
    keyed=True,
    policy="query",
    query=lambda a, k: Found(),
)
EMAIL = Tool(name="email.send", effect="irreversible")


def charge_log(wf: str, status: OutcomeStatus | None) -> list[ev.Event]:
    events = [
        F.workflow_started(wf, name="", attempt=1, read_only=False, max_attempts=2),
        F.intent(wf, "charge", CHARGE, {"amount": 1}, sequence=0),
    ]
    if status is not None:
        events.append(F.outcome(wf, "charge", attempt=1, status=status))
    return events


def key_of(events: list[ev.Event]) -> str:
    return next(e.body.idempotency_key for e in events if isinstance(e.body, ev.StepIntended))


def kinds(evidence: Evidence) -> set[str]:
    """The invariants broken (one defect may break one invariant in several ways)."""
    return {v.invariant for v in check_all(evidence)}


def test_a_clean_history_passes() -> None:
    log = charge_log("w", OutcomeStatus.SUCCEEDED)
    evidence = Evidence(log, {e.event_id for e in log}, {"charge": {key_of(log): 1}}, {"w": 1})
    assert check_all(evidence) == []


def test_each_broken_invariant_is_named() -> None:
    succeeded = charge_log("w", OutcomeStatus.SUCCEEDED)
    assert kinds(
        Evidence(
            succeeded, effects={"charge": {key_of(succeeded): 2}}, charges_by_workflow={"w": 2}
        )
    ) == {"keyed_effect_exactly_once"}
    assert kinds(Evidence(succeeded, effects={}, charges_by_workflow={})) == {
        "keyed_effect_exactly_once"
    }
    doubt = charge_log("w", None)
    assert kinds(Evidence(doubt)) == {"every_intent_resolved_or_escalated"}
    lost = Evidence(succeeded, {"never-written"}, {"charge": {key_of(succeeded): 1}}, {"w": 1})
    assert kinds(lost) == {"no_acknowledged_event_lost"}
    diff = Evidence(
        succeeded,
        effects={"charge": {key_of(succeeded): 1}},
        charges_by_workflow={"w": 1},
        projection_diff=["table steps: differs"],
    )
    assert kinds(diff) == {"projection_equals_rebuild"}


def test_unkeyed_email_sent_twice_is_caught() -> None:
    log = [
        F.workflow_started("m", name="", attempt=1, read_only=False, max_attempts=2),
        F.intent("m", "email", EMAIL, {"to": "x"}, sequence=0),
        F.outcome("m", "email", attempt=1, status=OutcomeStatus.SUCCEEDED),
    ]
    assert kinds(Evidence(log, emails_by_workflow={"m": 2})) == {"unkeyed_effect_at_most_once"}
    assert kinds(Evidence(log, emails_by_workflow={"m": 1})) == set()


def test_running_past_the_resumption_limit_is_caught() -> None:
    log = charge_log("r", OutcomeStatus.NOT_HAPPENED)
    log += [F.envelope("r", None, ev.WorkflowResumed(attempt=a)) for a in (2, 3)]
    assert "resumption_bounded" in kinds(Evidence(log))
    dead = ev.WorkflowDeadLettered(attempt=3, reason="limit", escalation_id="e")
    assert "resumption_bounded" not in kinds(Evidence([*log, F.envelope("r", None, dead)]))


def test_late_recovery_decision_source_does_not_matter() -> None:
    log = charge_log("q", None)
    log.append(
        F.outcome(
            "q",
            "charge",
            attempt=1,
            status=OutcomeStatus.NOT_HAPPENED,
            source=Source.RECOVERY_QUERY,
        )
    )
    assert kinds(Evidence(log, effects={"charge": {key_of(log): 1}})) == {
        "keyed_effect_exactly_once"
    }


def test_plans_are_reproducible_from_the_seed() -> None:
    a = make_plan(50, 9, steps=4, max_attempts=3, broker_restarts=True)
    b = make_plan(50, 9, steps=4, max_attempts=3, broker_restarts=True)
    assert a == b and a != make_plan(50, 10, steps=4, max_attempts=3, broker_restarts=True)
    labels = {w.label for w in a.workflows}
    assert {CrashPoint.AFTER_INTENT, CrashPoint.AFTER_CALL} <= labels
    assert any(f.point is CrashPoint.BROKER_RESTART for f in a.infra)
    loops = [w for w in a.workflows if w.label is CrashPoint.CRASH_LOOP]
    assert all(len(w.kills) == 4 for w in loops)


def test_a_workflow_ended_compensated_with_an_effect_left_standing_is_flagged() -> None:
    log = charge_log("w", OutcomeStatus.SUCCEEDED)
    key = key_of(log)
    log.append(F.envelope("w", None, ev.WorkflowFinished(status=WorkflowStatus.COMPENSATED)))
    charged = {"charge": {key: 1}}
    standing = Evidence(log, effects=charged, charges_by_workflow={"w": 1})
    standing.captured_by_workflow = {"w": 1}
    assert kinds(standing) == {"compensated_leaves_nothing_standing"}
    refunded = Evidence(log, effects=charged, charges_by_workflow={"w": 1})
    assert "compensated_leaves_nothing_standing" not in kinds(refunded)
    emailed = Evidence(
        log, effects=charged, charges_by_workflow={"w": 1}, emails_by_workflow={"w": 1}
    )
    assert "compensated_leaves_nothing_standing" in kinds(emailed)


def _by(event: ev.Event, producer: str) -> ev.Event:
    return event.model_copy(update={"producer_id": producer})


def _query_outcome(wf: str, producer: str) -> ev.Event:
    outcome = F.outcome(
        wf, "charge", attempt=1, status=OutcomeStatus.SUCCEEDED, source=Source.RECOVERY_QUERY
    )
    return _by(outcome, producer)


def test_a_step_decided_by_two_daemons_is_flagged_even_under_one_event_id() -> None:
    log = charge_log("w", None)
    twice = [*log, _query_outcome("w", "h:1"), _query_outcome("w", "h:2")]
    assert twice[-1].event_id == twice[-2].event_id
    found = decided_by_one_daemon(twice, frozenset({"h:1", "h:2"}))
    assert [v.invariant for v in found] == ["in_doubt_step_decided_once"]
    assert "h:1" in found[0].detail and "h:2" in found[0].detail
    # The same record from an agent's resume (not a daemon) is a race the fold settles.
    assert decided_by_one_daemon(twice, frozenset({"h:1"})) == []
    # An escalation after the decision is not a second decision.
    note = ev.StepAbandoned(reason="late outcome", escalation_id="e", source=Source.RECOVERY)
    escalated = [*log, _query_outcome("w", "h:1"), _by(F.envelope("w", "charge", note), "h:1")]
    assert decided_by_one_daemon(escalated, frozenset({"h:1"})) == []
    # A new attempt is decided on its own.
    again = F.intent("w", "charge", CHARGE, {"amount": 1}, sequence=0, attempt=2)
    retried = [*log, _query_outcome("w", "h:1"), again]
    retried.append(
        _by(
            F.outcome(
                "w", "charge", attempt=2, status=OutcomeStatus.FAILED, source=Source.RECOVERY_QUERY
            ),
            "h:2",
        )
    )
    assert decided_by_one_daemon(retried, frozenset({"h:1", "h:2"})) == []
    assert len(daemon_decisions(retried, frozenset({"h:1", "h:2"}))) == 2


def test_a_partition_replayed_from_zero_twice_or_never_is_flagged() -> None:
    once = {p: 1 for p in range(4)}
    assert replayed_from_zero_once({"projector": once, "recovery": once}, 4) == []
    assert replayed_from_zero_once({}, 0) == [], "unchecked with one daemon of each kind"
    found = replayed_from_zero_once({"projector": {**once, 2: 2}, "recovery": {0: 1}}, 4)
    assert [v.detail.split(":")[0] for v in found] == [
        "projector",
        "recovery",
        "recovery",
        "recovery",
    ]
    assert "partition 2 replayed from offset 0 2 time(s)" in found[0].detail


def test_without_a_shared_volume_each_member_replays_a_partition_at_most_once() -> None:
    members = {"projector-0": {0: 1, 1: 1}, "projector-1": {1: 1, 2: 1}, "projector-2": {}}
    assert replayed_once_per_member(members, 3) == []
    found = replayed_once_per_member({"projector-0": {0: 2, 1: 1}}, 3)
    assert [v.detail for v in found] == [
        "projector projector-0: partition 0 replayed from offset 0 2 time(s), expected at "
        "most once",
        "projector: partition 2 never replayed from offset 0 by any member",
    ]
    # In that mode only recovery's replays are counted once per run.
    evidence = Evidence(
        events=[],
        partitions=2,
        no_shared_state=True,
        replays_from_zero={"projector": {0: 3, 1: 2}, "recovery": {0: 1, 1: 1}},
        projector_replays_by_member={"projector-0": {0: 1, 1: 1}, "projector-1": {0: 1, 1: 1}},
    )
    assert check_all(evidence) == []


def test_a_scaled_plan_kills_stops_and_adds_members_of_both_groups_once() -> None:
    plan = make_plan(30, 1, steps=4, max_attempts=3, broker_restarts=False, scaled=True)
    points = [f.point for f in plan.infra]
    assert sorted(points) == sorted(p for p, _ in SCALE_FAULTS)
    assert CrashPoint.RECOVERY_STOP in points and CrashPoint.PROJECTOR_ADDED in points
    plain = make_plan(30, 1, steps=4, max_attempts=3, broker_restarts=False)
    assert plain.workflows == plan.workflows
    assert CrashPoint.RECOVERY_ADDED not in {f.point for f in plain.infra}


def test_into_one_lake_each_partition_is_read_from_zero_once_whoever_owns_it_later() -> None:
    # A later owner on another state directory continues from the lake's offset: a second
    # replay from 0 (as a member without its shard does in the file mode) is a violation.
    members = {"projector-0": {0: 1, 1: 1}, "projector-1": {}}
    once = {"projector": {0: 1, 1: 1}, "recovery": {0: 1, 1: 1}}
    lake = Evidence(
        events=[],
        partitions=2,
        no_shared_state=True,
        lake=True,
        replays_from_zero=once,
        projector_replays_by_member=members,
    )
    assert check_all(lake) == []
    twice = {**once, "projector": {0: 2, 1: 1}}
    found = check_all(replace(lake, replays_from_zero=twice))
    assert [v.detail for v in found] == [
        "projector: partition 0 replayed from offset 0 2 time(s), expected once"
    ]


def test_a_plan_draws_scale_faults_only_for_groups_with_a_member_to_spare() -> None:
    plan = make_plan(
        8,
        4,
        steps=4,
        max_attempts=3,
        broker_restarts=False,
        scaled=True,
        scaled_roles=("projector",),
    )
    assert sorted(f.point.value for f in plan.infra) == [
        "consumer:sigstop_sigcont",
        "projector:added",
        "projector:mid_batch",
    ]


def test_the_analyst_flags_a_read_whose_tables_are_at_different_offsets() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE offsets (topic VARCHAR, partition INTEGER, next_offset BIGINT)")
    con.execute("CREATE TABLE events (topic VARCHAR, partition INTEGER, log_offset BIGINT)")
    con.execute("CREATE TABLE steps (workflow_id VARCHAR, step_id VARCHAR)")
    con.execute("CREATE TABLE workflows (workflow_id VARCHAR, steps INTEGER)")
    con.execute("INSERT INTO offsets VALUES ('t', 0, 2), ('t', 1, 0)")
    con.execute("INSERT INTO events VALUES ('t', 0, 0), ('t', 0, 1)")
    con.execute("INSERT INTO steps VALUES ('w', 'a'), ('w', 'b')")
    con.execute("INSERT INTO workflows VALUES ('w', 2)")
    cut = read_cut(con)
    assert cut == {
        "partitions": 2,
        "records": 2,
        "workflows": 1,
        "partitions_apart": 0,
        "workflows_apart": 0,
    }
    assert analyst_violations([cut] * 3) == []
    # Rows past their partition's offset, and a workflow read before its newest step.
    con.execute("INSERT INTO events VALUES ('t', 1, 0)")
    con.execute("INSERT INTO steps VALUES ('w', 'c')")
    apart = read_cut(con)
    assert (apart["partitions_apart"], apart["workflows_apart"]) == (1, 1)
    found = analyst_violations([cut, apart, cut])
    assert [v.invariant for v in found] == ["analyst_consistent_cut"]
    # An analyst that never read the lake (always an error) proves nothing.
    never = analyst_violations([{"error": "no tables yet"}] * 5)
    assert [v.invariant for v in never] == ["analyst_read_the_lake"]
