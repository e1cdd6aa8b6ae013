"""One rule for the answers a case takes (the inbox's buttons, ``escalations resolve``), and
one sentence for what an answer causes and who acts next.

Measured on a fresh clone: the inbox offered "It happened and was undone" for an
irreversible email, and after an answer nothing said that the workflow stays ``running``
until its agent opens it again.
"""

from __future__ import annotations

import pytest

from stepledger.domain import events as ev
from stepledger.domain.enums import Source, Verdict
from stepledger.domain.factory import EventFactory
from stepledger.errors import LedgerStateError
from stepledger.humanqueue import escalations
from stepledger.humanqueue.after import what_next
from stepledger.humanqueue.cases import Answer, escalation_case
from stepledger.log import InMemoryEventLog
from tests.integration import inbox_helpers as h

FINAL = (Answer.HAPPENED, Answer.NOT_HAPPENED)


def _wire() -> list[ev.Event]:
    return list(h.escalated_wire(h.factory(), "trip-1", "esc-1"))


def test_an_irreversible_step_is_not_offered_happened_and_undone_by_the_inbox_or_the_cli() -> None:
    events = _wire()
    case = escalation_case("trip-1", "esc-1", events)
    assert case is not None and case.options == FINAL
    item = escalations.EscalationQueue().extend(events).get("esc-1")
    assert tuple(Answer(v.value) for v in item.options) == case.options  # one rule for both
    with pytest.raises(LedgerStateError, match="send_wire declares no way to undo its effect"):
        escalations.answer(
            InMemoryEventLog(), EventFactory("f", "p"), item, Verdict.COMPENSATED, by="ana"
        )


def test_a_step_whose_effect_can_be_undone_takes_compensated_too() -> None:
    events = list(h.escalated_lookup(h.factory(), "pay-1", "esc-2"))
    case = escalation_case("pay-1", "esc-2", events)
    assert case is not None and case.options == FINAL  # idempotent, no compensation
    f = h.factory()
    intent = f.intent("trip-2", "hold", h.HOLD, {"nights": 1}, sequence=0)
    abandoned = f.envelope(
        "trip-2",
        "hold",
        ev.StepAbandoned(
            reason="compensation kept failing", escalation_id="esc-3", source=Source.RECOVERY
        ),
    )
    undoable = escalation_case("trip-2", "esc-3", [intent, abandoned])
    assert undoable is not None and Answer.COMPENSATED in undoable.options


@pytest.mark.parametrize(
    ("verdict", "says"),
    [
        (Verdict.HAPPENED, "goes on past it without calling send_wire again"),
        (Verdict.NOT_HAPPENED, "calls send_wire again, once, under the same idempotency key"),
    ],
)
def test_after_an_answer_the_case_says_what_it_caused_and_who_acts_next(
    verdict: Verdict, says: str
) -> None:
    events = _wire()
    item = escalations.EscalationQueue().extend(events).get("esc-1")
    log = InMemoryEventLog()
    answer = escalations.answer(log, h.factory(), item, verdict, by="ana", note="checked")
    case = escalation_case("trip-1", "esc-1", [*events, answer])
    assert case is not None
    text = what_next(case)
    assert says in text
    assert "Nothing runs by itself" in text and "(running now)" in text
    assert "ledger.workflow('trip-1')" in text
    open_case = escalation_case("trip-1", "esc-1", events)
    assert open_case is not None and what_next(open_case) == ""
