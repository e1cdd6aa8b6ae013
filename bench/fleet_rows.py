"""The fleet bench's rows: names, baselines and targets of its four row groups (no I/O)."""

from __future__ import annotations

from typing import Any

from bench.common import Row, percentile
from bench.fleet_figures import Decisions, ratio_trend

BENCH = "fleet"
#: Targets (issue 48): a replicated step's p50 and p99 against the raw two-acks floor.
LATENCY_TARGETS = {50: "<=1.3", 99: "<=1.5"}
#: Processes whose throughput ratio has a floor, and the floor.
RATIO_AT, RATIO_FLOOR = 4, ">=0.5"
#: "The ratio does not fall as processes are added": the most processes' ratio against the
#: fewest's, with 10% for the noise of a shared machine.
TREND = ">=0.9"
#: The throughput row's peers, by ``bench.fleet_agent rate`` kind.
PEERS = {"restate": "Restate 1.7", "dbos": "DBOS 3.4 on PostgreSQL, an executor id per process"}
#: Freshness target: p99 from acknowledgement to visible, in seconds.
FRESH_P99_S = 2.0
#: Time to decision: the last decision at most this long after its deadline + grace.
DECISION_SLACK_S = 5.0


def latency_rows(raw: list[float], ours: list[float]) -> list[Row]:
    """Row group 1: a sequential step's p50 and p99 (ms) against the raw two-acks floor."""
    return [
        Row(
            BENCH,
            f"replicated sequential step p{q} (vs raw two-acks floor p{q})",
            percentile(ours, q) * 1000,
            percentile(raw, q) * 1000,
            "ms",
            target,
            False,
        )
        for q, target in LATENCY_TARGETS.items()
    ]


def throughput_rows(rates: dict[int, dict[str, dict[str, float]]], agents: int) -> list[Row]:
    """Row group 2: steps/s per process count, where the CPU goes, and the ratio's trend."""
    rows: list[Row] = []
    ratios: dict[int, float] = {}
    for processes, kinds in sorted(rates.items()):
        ours, raw = kinds["stepledger"], kinds["raw"]
        ratios[processes] = ours["rate"] / raw["rate"] if raw["rate"] else 0.0
        label = f"{processes} process{'es' if processes > 1 else ''} x {agents} asyncio agents"
        rows += [
            Row(
                BENCH,
                f"{label}, steps/s (vs raw clients, same processes and concurrency)",
                ours["rate"],
                raw["rate"],
                "steps/s",
                RATIO_FLOOR if processes == RATIO_AT else "",
            ),
            Row(
                BENCH,
                f"{label}, client CPU per step, Python threads (vs raw's; librdkafka's threads "
                f"{ours['librdkafka_us']:,.0f} us vs {raw['librdkafka_us']:,.0f})",
                ours["python_us"],
                raw["python_us"],
                "us",
                higher_is_better=False,
            ),
        ]
        for peer, name in PEERS.items():
            if peer in kinds:
                rows.append(
                    Row(
                        BENCH,
                        f"{label}, steps/s (vs {name}, one node, same processes and concurrency)",
                        ours["rate"],
                        kinds[peer]["rate"],
                        "steps/s",
                    )
                )
        if ours["broker_us"]:
            rows.append(
                Row(
                    BENCH,
                    f"{label}, brokers' CPU per step (vs raw's)",
                    ours["broker_us"],
                    raw["broker_us"],
                    "us",
                    higher_is_better=False,
                )
            )
    if len(ratios) > 1:
        most, fewest = ratio_trend(ratios)
        rows.append(
            Row(
                BENCH,
                f"steps/s ratio at {max(ratios)} processes (vs the ratio at {min(ratios)})",
                most,
                fewest,
                "ratio",
                TREND,
            )
        )
    return rows


def freshness_rows(
    lags_s: list[float],
    missed: int,
    sustained: float,
    processes: int,
    committed: list[float] | None = None,
) -> list[Row]:
    """Row group 3: ack-to-visible p50 and p99 at half the sustained rate (the baseline of
    the p99 row is the target, so its ratio reads against 1), and the part of it that is
    the projector's commit (each batch's oldest event to committed in DuckDB)."""
    committed = committed or []
    rate = f"{sustained / 2:,.0f} steps/s (half of {sustained:,.0f}, {processes} processes)"
    return [
        Row(
            BENCH,
            f"freshness at {rate}: outcome ack to analyst-visible (file mode), p50",
            percentile(lags_s, 50),
            None,
            "s",
            higher_is_better=False,
        ),
        Row(
            BENCH,
            f"freshness, p99 (vs the {FRESH_P99_S:.0f} s target; {len(lags_s):,} steps, "
            f"{missed} never seen)",
            percentile(lags_s, 99),
            FRESH_P99_S,
            "s",
            "<=1",
            False,
        ),
        *(
            Row(
                BENCH,
                f"freshness, of which event to committed in DuckDB, p{q} (the projector's "
                f"log, {len(committed):,} batches; the rest: the snapshot's interval and copy)",
                percentile(committed, q),
                None,
                "s",
                higher_is_better=False,
            )
            for q in (50, 99)
            if committed
        ),
    ]


def decision_rows(found: Decisions, expected: int, timeout_s: float, grace_s: float) -> list[Row]:
    """Row group 4: the time from intent to decision of the last and the median step,
    against the intent's timeout + grace (the policy's own wait: the floor)."""
    floor = timeout_s + grace_s
    limit = (floor + DECISION_SLACK_S) / floor
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(found.by_kind.items()))
    worst: Any = max(found.late_s) if found.late_s else float("nan")
    return [
        Row(
            BENCH,
            f"time to decision, last of {expected:,} in doubt after SIGKILL: intent to decision "
            f"(vs timeout + grace, {floor:g} s; target: within +{DECISION_SLACK_S:.0f} s)",
            floor + worst,
            floor,
            "s",
            f"<={limit:.2f}",
            False,
        ),
        Row(
            BENCH,
            "time to decision, p50: intent to decision (vs timeout + grace)",
            floor + percentile(found.late_s, 50),
            floor,
            "s",
            higher_is_better=False,
        ),
        Row(
            BENCH,
            f"decided before their deadline (target 0; decided: {kinds or 'none'})",
            found.early,
            None,
            "steps",
            higher_is_better=False,
        ),
        Row(
            BENCH,
            "left undecided (target 0)",
            expected - len(found.late_s),
            None,
            "steps",
            higher_is_better=False,
        ),
    ]


def diagnosis_rows(rates: dict[int, dict[str, dict[str, float]]], agents: int) -> list[Row]:
    """``--diagnose``: keyed steps against a read-only tool's, steps/s and CPU per step
    (Python threads, librdkafka's, the brokers'), and each against raw clients."""
    rows: list[Row] = []
    for processes, kinds in sorted(rates.items()):
        label = f"{processes} process{'es' if processes > 1 else ''} x {agents} asyncio agents"
        for kind in ("stepledger", "readonly"):
            figures, raw = kinds[kind], kinds["raw"]
            what = "keyed steps" if kind == "stepledger" else "read-only steps (no read-back)"
            rows.append(
                Row(
                    BENCH,
                    f"{label}, {what}, steps/s (vs raw)",
                    figures["rate"],
                    raw["rate"],
                    "steps/s",
                )
            )
            for part in ("python_us", "librdkafka_us", "broker_us"):
                rows.append(
                    Row(
                        BENCH,
                        f"{label}, {what}, CPU per step, {part[:-3]} (vs raw)",
                        figures[part],
                        raw[part],
                        "us",
                        higher_is_better=False,
                    )
                )
    return rows
