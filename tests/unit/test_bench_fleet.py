"""The fleet bench's arithmetic and rows on made-up figures (no broker, no processes, no time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bench import fleet_rows
from bench.common import percentile
from bench.fleet_figures import (
    Doubt,
    decisions,
    doubts,
    lags,
    paced_due,
    ratio_trend,
    span_rate,
)
from stepledger.domain import events as ev
from stepledger.domain.enums import OutcomeStatus, Source
from stepledger.domain.factory import EventFactory
from stepledger.domain.tools import Tool

T0 = datetime(2026, 12, 5, tzinfo=UTC)


def test_percentile_picks_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 51.0  # round(0.5 * 99) = 50 -> the 51st
    assert percentile(values, 99) == 99.0
    assert percentile(list(reversed(values)), 99) == 99.0
    assert percentile([], 50) != percentile([], 50)  # NaN


def test_span_rate_counts_every_step_over_the_whole_span() -> None:
    reports = [
        {"began": 10.0, "ended": 12.0, "steps": 100},
        {"began": 11.0, "ended": 14.0, "steps": 300},
    ]
    assert span_rate(reports) == 100.0  # 400 steps from 10 s to 14 s
    assert span_rate([]) == 0.0


def test_ratio_trend_sets_the_most_processes_against_the_fewest() -> None:
    assert ratio_trend({2: 0.6, 1: 0.8, 4: 0.5}) == (0.5, 0.8)


def test_a_falling_ratio_misses_the_trend_target_and_a_held_one_meets_it() -> None:
    def rates(ours4: float) -> dict[int, dict[str, dict[str, float]]]:
        figures = {"python_us": 1.0, "librdkafka_us": 1.0, "broker_us": 0.0}
        return {
            1: {"stepledger": {"rate": 500.0, **figures}, "raw": {"rate": 1000.0, **figures}},
            4: {"stepledger": {"rate": ours4, **figures}, "raw": {"rate": 2000.0, **figures}},
        }

    falling = fleet_rows.throughput_rows(rates(600.0), 32)
    held = fleet_rows.throughput_rows(rates(1000.0), 32)
    assert [r.met for r in falling if r.target] == ["no", "no"]  # 0.3 at P=4, 0.6 of P=1's
    assert [r.met for r in held if r.target] == ["yes", "yes"]  # 0.5 at P=4, the same ratio


def test_lags_pair_each_ack_with_its_first_sighting() -> None:
    acked = {("w", "s0"): 1.0, ("w", "s1"): 2.0, ("w", "s2"): 3.0}
    seen = {("w", "s0"): 1.5, ("w", "s1"): 4.0, ("x", "s0"): 9.0}
    found, missed = lags(acked, seen)
    assert sorted(found) == [0.5, 2.0]
    assert missed == 1


def test_paced_steps_interleave_the_agents_evenly() -> None:
    due = sorted(paced_due(0.0, 100.0, 4, agent, n) for agent in range(4) for n in range(5))
    assert due == [i / 100 for i in range(20)]


def _events(timeout_s: float, decided_after_s: float) -> list[ev.Event]:
    tool = Tool(name="t", keyed=True, timeout_s=timeout_s)
    agent = EventFactory("bench", "agent", clock=lambda: T0)
    later = EventFactory("bench", "recovery", clock=lambda: T0 + timedelta(seconds=decided_after_s))
    return [
        agent.intent("doubt-1", "s0", tool, {"i": 1}, sequence=0),
        agent.intent("other-1", "s0", tool, {"i": 1}, sequence=0),
        later.outcome(
            "doubt-1",
            "s0",
            attempt=1,
            status=OutcomeStatus.SUCCEEDED,
            source=Source.RECOVERY,
            result=1,
        ),
        later.outcome(
            "doubt-1", "s0", attempt=1, status=OutcomeStatus.FAILED, source=Source.RECOVERY
        ),
    ]


def test_doubts_take_the_intents_deadline_and_the_first_decision() -> None:
    found = doubts(_events(10.0, 12.5), "doubt-")
    assert list(found) == [("doubt-1", "s0")]
    doubt = found[("doubt-1", "s0")]
    assert doubt.deadline == T0 + timedelta(seconds=10)
    assert doubt.decided_at == T0 + timedelta(seconds=12.5)
    assert doubt.decision == "step_outcome"


def test_doubts_fold_one_event_at_a_time_into_what_was_read() -> None:
    found: dict[tuple[str, str], Doubt] = {}
    for event in _events(10.0, 12.5):
        doubts([event], "doubt-", found)
    assert found == doubts(_events(10.0, 12.5), "doubt-")


def test_decisions_measure_lateness_after_deadline_and_grace() -> None:
    deadline = T0 + timedelta(seconds=10)
    found = {
        ("a", "s"): Doubt(deadline, deadline + timedelta(seconds=3), "step_outcome"),
        ("b", "s"): Doubt(deadline, deadline - timedelta(seconds=1), "step_abandoned"),
        ("c", "s"): Doubt(deadline),
    }
    result = decisions(found, grace_s=2.0)
    assert sorted(result.late_s) == [-3.0, 1.0]
    assert result.early == 1
    assert result.undecided == 1
    assert result.by_kind == {"step_outcome": 1, "step_abandoned": 1}


@pytest.mark.parametrize(("late_s", "met"), [(4.9, "yes"), (5.1, "no")])
def test_the_last_decision_meets_its_target_within_five_seconds(late_s: float, met: str) -> None:
    deadline = T0 + timedelta(seconds=15)
    found = {("a", "s"): Doubt(deadline, deadline + timedelta(seconds=2 + late_s), "x")}
    last = fleet_rows.decision_rows(decisions(found, 2.0), 1, 15.0, 2.0)[0]
    assert last.met == met


def test_latency_rows_judge_p50_and_p99_against_the_floor() -> None:
    raw = [0.001] * 100
    rows = fleet_rows.latency_rows(raw, [0.0012] * 98 + [0.002] * 2)
    assert [r.ratio for r in rows] == pytest.approx([1.2, 2.0])
    assert [r.met for r in rows] == ["yes", "no"]


def test_freshness_p99_is_judged_against_two_seconds() -> None:
    rows = fleet_rows.freshness_rows([0.5] * 98 + [2.5] * 2, 0, 1000.0, 4)
    assert rows[1].baseline == 2.0
    assert rows[1].met == "no"
    assert fleet_rows.freshness_rows([0.5] * 100, 0, 1000.0, 4)[1].met == "yes"


def test_the_diagnosis_sets_keyed_and_read_only_steps_against_raw() -> None:
    def figures(rate: float, broker_us: float) -> dict[str, float]:
        return {"rate": rate, "python_us": 100.0, "librdkafka_us": 50.0, "broker_us": broker_us}

    rates = {
        1: {
            "raw": figures(1000.0, 100.0),
            "stepledger": figures(250.0, 400.0),
            "readonly": figures(500.0, 200.0),
        }
    }
    rows = fleet_rows.diagnosis_rows(rates, 32)
    by_name = {r.name: r for r in rows}
    assert by_name["1 process x 32 asyncio agents, keyed steps, steps/s (vs raw)"].ratio == 0.25
    read_only = "1 process x 32 asyncio agents, read-only steps (no read-back)"
    assert by_name[f"{read_only}, CPU per step, broker (vs raw)"].ratio == 2.0
    assert len(rows) == 8
