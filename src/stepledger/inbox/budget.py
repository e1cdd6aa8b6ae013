"""A fleet's model budget raised from the inbox (operators of the fleet only).

``POST /budget/raise`` with ``fleet``, ``tokens`` and/or ``cost``, an optional ``reason``
and the form's CSRF token appends ``budget_raised`` to the budget topic through
:func:`stepledger.producer.fleetbudget.raise_on`, the path ``stepledger budget raise``
takes: an answer in the log, naming the person as the inbox authenticated them; a runner
waiting on a refused turn goes on.  The answer is one line of text.
"""

from __future__ import annotations

import functools

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from stepledger.domain import events as ev
from stepledger.errors import StepLedgerError
from stepledger.humanqueue.answers import Answerer
from stepledger.inbox import access
from stepledger.inbox.auth import identity_of
from stepledger.inbox.roles import Action
from stepledger.log import KafkaEventLog
from stepledger.producer.fleetbudget import BudgetLog, InMemoryBudgetLog, KafkaBudgetLog, raise_on

MAX_REASON = 4000
MAX_TOKENS = 10**15
"""A raise larger than this is a typo, not a budget."""


class BudgetRaises:
    """The raise endpoint over the inbox's log."""

    def __init__(self, answerer: Answerer, csrf_secret: str) -> None:
        self.answerer = answerer
        self.csrf_secret = csrf_secret

    @functools.cached_property
    def log(self) -> BudgetLog:
        """The budget topic beside the inbox's step log (in memory beside an in-memory log)."""
        log = self.answerer.log
        if isinstance(log, KafkaEventLog):
            return KafkaBudgetLog(log.settings, log.codec, log.producer)
        return InMemoryBudgetLog()

    async def raise_budget(self, request: Request) -> Response:
        """Append one raise of the fleet named in the form."""
        form = await access.operator_form(request, self.csrf_secret)
        if isinstance(form, Response):
            return form
        fleet = str(form.get("fleet", ""))
        try:
            tokens = int(str(form.get("tokens") or 0))
            cost = float(str(form.get("cost") or 0))
        except ValueError:
            return PlainTextResponse("400: tokens is a whole number, cost a number", 400)
        if not fleet or not 0 <= tokens <= MAX_TOKENS or not 0 <= cost <= MAX_TOKENS:
            return PlainTextResponse("400: a fleet, and tokens and cost from 0 up", 400)
        if not tokens and not cost:
            return PlainTextResponse("400: give tokens and/or cost to add", 400)
        denied = access.refused(request, Action.CONTROL, fleet)
        if denied is not None:
            return denied
        who = identity_of(request)
        reason = str(form.get("reason", ""))[:MAX_REASON] or None
        body = ev.BudgetRaised(
            tokens=tokens, cost=cost, by=who.name, auth=who.auth.value, note=reason
        )
        producer = self.answerer.factory.producer_id
        try:
            spend = await run_in_threadpool(raise_on, self.log, fleet, producer, body)
        except StepLedgerError as exc:
            return PlainTextResponse(f"503: not recorded: {exc.message}", status_code=503)
        return PlainTextResponse(
            f"fleet {fleet}: raised by {tokens} tokens, cost {cost:.6g} by {who.name}; "
            f"committed {spend.tokens} tokens, raised {spend.raised_tokens} in all"
        )
