"""Cancel the demo trip at its saga positions: the services' own counts say what was undone.

Real parts only: the three example services as subprocesses counting their effects, the
trip agent (quote -> charge -> book -> email, the email the pivot) as a subprocess that
SIGKILLs itself with each workflow at its own boundary, the broker from the fixtures and
``stepledger workflows cancel --tools`` for the operator.  Before the pivot the cancel
undoes the charge and the booking and ends ``cancelled``; after it the email stands, so it
ends ``compensation_incomplete`` with an escalation; with the booking in doubt (intent
durable, no call) the booking is first settled by its policy, then the charge undone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stepledger.config import Settings
from stepledger.domain.ids import compensation_key, idempotency_key
from stepledger.domain.state import RunStatus
from stepledger_dev.examples.clients import PaymentsClient, start_service
from stepledger_dev.examples.tools import PAYMENTS
from tests.e2e.test_resume_crash import Stack, _keyed

pytestmark = pytest.mark.e2e
TOOLS = "stepledger_dev.examples.tools:registry"
#: Where each workflow stands when the operator cancels it, and what the cancel must leave.
CASES = {
    "cx-before-pivot": ("email:before_intent", RunStatus.CANCELLED),
    "cx-after-pivot": ("email:after_outcome", RunStatus.COMPENSATION_INCOMPLETE),
    "cx-book-in-doubt": ("book:after_intent", RunStatus.CANCELLED),
}


@pytest.fixture
def stack(settings: Settings, tmp_path: Path, src_env: dict[str, str]) -> Iterator[Stack]:
    services = {
        kind: start_service(kind, tmp_path / f"{kind}.sqlite")
        for kind in ("payments", "bookings", "email")
    }
    env = {
        **src_env,
        "STEPLEDGER_BOOTSTRAP": settings.bootstrap,
        "STEPLEDGER_TOPIC": settings.topic,
        "STEPLEDGER_DLQ_TOPIC": settings.dlq_topic,
        "STEPLEDGER_FLEET_ID": settings.fleet_id,
        "STEPLEDGER_PAYMENTS_URL": services["payments"].url,
        "STEPLEDGER_BOOKINGS_URL": services["bookings"].url,
        "STEPLEDGER_EMAIL_URL": services["email"].url,
        "STEPLEDGER_TOOL_TIMEOUT_S": "1.0",
    }
    try:
        yield Stack(settings, services, env)
    finally:
        for service in services.values():
            service.stop()


def refunds(stack: Stack, workflow_id: str) -> int:
    key = compensation_key(idempotency_key(workflow_id, "charge", PAYMENTS))
    return _keyed(PaymentsClient(stack.services["payments"].url), "refund", key)


def test_cancel_at_each_saga_position_undoes_what_it_can_and_escalates_the_rest(
    stack: Stack,
) -> None:
    code, _ = stack.agent(*(f"{wf}@{point}" for wf, (point, _) in CASES.items()))
    assert code == -9  # SIGKILLed with every workflow at its boundary
    before = {wf: stack.effects(wf) for wf in CASES}
    assert before["cx-after-pivot"]["email"] == 1 and before["cx-before-pivot"]["email"] == 0
    assert before["cx-book-in-doubt"]["booking"] == 0

    cancel = stack.cli(
        "workflows",
        "cancel",
        *CASES,
        "--tools",
        TOOLS,
        "--by",
        "ops",
        "--reason",
        "trip called off",
    )
    assert cancel.returncode == 0, cancel.stderr
    for wf, (_, ended) in CASES.items():
        assert f"{wf}: {ended.value}" in cancel.stdout, cancel.stdout

    states = stack.workflows()
    for wf, (_, ended) in CASES.items():
        effects = stack.effects(wf)
        assert states[wf].status is ended, wf
        assert states[wf].cancel_requested_by == "ops"
        assert effects["charge"] == 1 and refunds(stack, wf) == 1, (wf, effects)
        assert effects["cancel"] == effects["booking"], (wf, effects)  # every booking undone
    assert stack.effects("cx-after-pivot")["email"] == 1  # the pivot stands, escalated
    assert states["cx-after-pivot"].escalation_id is not None
    listed = stack.cli("escalations", "list")
    assert "cx-after-pivot" in listed.stdout, listed.stdout + listed.stderr

    again = stack.cli("workflows", "cancel", *CASES, "--tools", TOOLS, "--by", "ops")
    assert again.returncode == 0, again.stderr
    assert all(f"{wf}: not cancelled, it ended" in again.stdout for wf in CASES), again.stdout
    assert sum(refunds(stack, wf) for wf in CASES) == 3  # nothing undone twice

    # A restart from the charge would leave the sent email standing: refused, naming it.
    refused = stack.cli("workflows", "restart", "cx-after-pivot", "--from", "charge", "--yes")
    assert refused.returncode == 1 and "email (email.send" in refused.stderr, refused.stderr
    assert stack.workflows()["cx-after-pivot"].status is RunStatus.COMPENSATION_INCOMPLETE
