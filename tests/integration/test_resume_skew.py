"""A resuming agent judges an in-doubt step's deadline on the broker's append times, never
on its own wall clock (docs/guarantees.md, "Largest skew"; DESIGN invariant 15).

The writer dies inside a keyed call (its intent stays in doubt); a second agent whose
clock runs minutes off the writer's resumes the workflow at once and settles the step by
its policy (a re-drive under the same key).  By the broker's own timestamps, the re-drive
comes no earlier than the intent's timeout after the intent's append (a clock ahead used
to find the recorded deadline long past and re-drive while the writer could still be
inside its call), and within the timeout plus the grace and some slack (a clock behind
waits for no recorded deadline minutes away).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from stepledger.config import Settings
from stepledger.domain import events as ev
from stepledger.domain.factory import utc_now
from stepledger.domain.state import StepStatus
from stepledger.domain.tools import Tool
from stepledger.history.clock import LOG_APPEND_TIME
from stepledger.kafka import topic_partitions
from stepledger.kafka.reader import records_to_end
from stepledger.log import codec_for
from stepledger.producer import Ledger, ResumeOptions
from tests.conftest import unique

pytestmark = pytest.mark.kafka_only
TIMEOUT_S = 4.0
GRACE_S = 0.5
#: Scheduling on a loaded machine: the re-drive may come this much after it is due.
SLACK_S = 6.0


class Died(BaseException):
    """Stands for a SIGKILL inside the call: no outcome is recorded."""


@pytest.mark.parametrize("skew_s", [300.0, -300.0])
def test_a_resuming_agent_minutes_off_settles_a_step_on_the_brokers_deadline(
    settings: Settings, skew_s: float
) -> None:
    redriven: list[str] = []

    def notify(args: dict[str, Any], key: str) -> dict[str, str]:
        redriven.append(key)
        return {"sent": key}

    tool = Tool(name="notify", keyed=True, policy="redrive", timeout_s=TIMEOUT_S, run=notify)
    workflow = unique("wf-skew")

    def dies(args: dict[str, Any], key: str) -> Any:
        raise Died

    with Ledger(settings, tools=[tool]) as writer, pytest.raises(Died):
        writer.workflow(workflow).step("s", tool, {"to": "ana"}, dies)
    options = ResumeOptions(grace_s=GRACE_S, resolve_timeout_s=60.0)
    skewed = Ledger(
        settings,
        tools=[tool],
        clock=lambda: utc_now() + timedelta(seconds=skew_s),
        options=options,
    )
    with skewed as ledger:
        wf = ledger.workflow(workflow)  # settles the step in doubt before it returns
        assert wf.state.steps["s"].status is StepStatus.SUCCEEDED
    assert len(redriven) == 1

    stamped = _broker_times(settings, workflow)
    at = next(i for i, (e, _) in enumerate(stamped) if isinstance(e.body, ev.StepIntended))
    intent = stamped[at][1]
    # The step's first record after its intent is the resuming agent's decision.
    decided = next(ms for e, ms in stamped[at + 1 :] if e.step_id == "s")
    waited = (decided - intent) / 1000
    assert waited >= TIMEOUT_S, f"decided {TIMEOUT_S - waited:.3f}s before the deadline"
    assert waited <= TIMEOUT_S + GRACE_S + SLACK_S, f"decided {waited:.3f}s after the intent"


def _broker_times(settings: Settings, workflow: str) -> list[tuple[ev.Event, int]]:
    """The workflow's events in log order, each with its broker append time (ms)."""
    codec = codec_for(settings)
    starts = {(settings.topic, p): 0 for p in topic_partitions(settings, settings.topic)}
    found: list[tuple[ev.Event, int]] = []
    for batch in records_to_end(settings, starts, group=unique("witness"), within=30.0):
        for record in batch:
            if record.key != workflow.encode():
                continue
            kind, millis = record.timestamp
            assert kind == LOG_APPEND_TIME  # the step log is stamped by the broker
            found.append((codec.decode(record.value), millis))
    return found
