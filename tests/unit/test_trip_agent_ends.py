"""The chaos agent never hangs on a thread that raised: it reports a bug the harness names."""

from __future__ import annotations

import json
import threading

import pytest

from stepledger.errors import StepLedgerError
from stepledger_dev.chaos.harness import Run
from stepledger_dev.examples.trip_agent import BUG, Parking, outcome_of


def test_an_exception_outside_the_tree_is_a_bug_report_not_a_dead_thread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken() -> dict[str, str]:
        raise KeyError("charge")

    assert outcome_of(broken) == {"status": BUG, "error": "KeyError: 'charge'"}
    assert "Traceback" in capsys.readouterr().err


def test_an_error_of_the_tree_stays_an_error() -> None:
    def refused() -> dict[str, str]:
        raise StepLedgerError("no broker")

    assert outcome_of(refused) == {"status": "error", "error": "StepLedgerError: no broker"}


def test_every_workflow_reports_even_when_one_thread_raises() -> None:
    parking = Parking()

    def one(n: int) -> None:
        def run() -> dict[str, str]:
            if n == 1:
                raise RuntimeError("a bug")
            return {"status": "completed"}

        parking.report({"workflow": f"w{n}", **outcome_of(run)})

    threads = [threading.Thread(target=one, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    assert parking.wait_all(3, timeout=10), "a thread that raised left the agent waiting"
    assert sorted(r["status"] for r in parking.reports) == [BUG, "completed", "completed"]


def test_the_harness_names_a_bug_report_as_a_violation() -> None:
    run = Run.__new__(Run)  # only the report parsing: no stack, no broker
    run.problems = []
    lines = [
        json.dumps({"workflow": "w1", "status": "completed"}),
        json.dumps({"superseded_runner": "w2", "status": BUG, "error": "KeyError: 'x'"}),
        "not json",
    ]
    statuses = run._take_reports("\n".join(lines))
    assert statuses == {"w1": "completed"}
    assert [(v.invariant, v.detail) for v in run.problems] == [
        ("agent_raised_a_bug", "w2: KeyError: 'x'")
    ]
