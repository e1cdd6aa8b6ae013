"""A workflow's controls in the inbox: pause, unpause, cancel (operators of its fleet only).

``POST /workflows/{workflow_id}/control`` with ``command`` (``pause``, ``unpause`` or
``cancel``), an optional ``reason`` and the form's CSRF token appends the command's event
through :class:`stepledger.humanqueue.operators.Operators`, the path ``stepledger workflows
pause|unpause|cancel`` takes.  The person must be an operator whose fleets hold the
workflow (the fleet the log gives it, :meth:`Grant.refusal`); the event names them as the
inbox authenticated them.  A cancel is asked here; its compensations run where the tools
are (``stepledger workflows cancel ID --tools ...``).  The answer is one line of text.
"""

from __future__ import annotations

import functools

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from stepledger.errors import LedgerStateError, StepLedgerError
from stepledger.humanqueue.answers import Answerer
from stepledger.humanqueue.operators import COMMANDS, Operator, Operators
from stepledger.inbox import access
from stepledger.inbox.auth import identity_of
from stepledger.inbox.roles import Action

MAX_REASON = 4000


class OperatorEndpoint:
    """What an operator's endpoint holds: the answerer, the CSRF secret, and the operators'
    commands over the answerer's log and history (made at first use)."""

    def __init__(self, answerer: Answerer, csrf_secret: str) -> None:
        self.answerer = answerer
        self.csrf_secret = csrf_secret

    @functools.cached_property
    def operators(self) -> Operators:
        """The operators' commands over the answerer's log and history."""
        answerer = self.answerer
        return Operators(answerer.log, answerer.factory, answerer.history)


class Controls(OperatorEndpoint):
    """The control endpoint over the inbox's log and history."""

    async def control(self, request: Request) -> Response:
        """Append one operator command to the workflow named in the path."""
        workflow_id = request.path_params["workflow_id"]
        form = await access.operator_form(request, self.csrf_secret)
        if isinstance(form, Response):
            return form
        command = str(form.get("command", ""))
        reason = str(form.get("reason", ""))[:MAX_REASON]
        if command not in COMMANDS:
            return PlainTextResponse(f"400: unknown command {command!r}", status_code=400)
        try:
            state = await run_in_threadpool(self.operators.state, workflow_id)
        except LedgerStateError as exc:
            return PlainTextResponse(f"404: {exc.message}", status_code=404)
        denied = access.refused(request, Action.CONTROL, state.fleet_id)
        if denied is not None:
            return denied
        who = identity_of(request)
        operator = Operator(who.name, who.auth.value, reason)
        try:
            done = await run_in_threadpool(self.operators.steer, command, [workflow_id], operator)
        except StepLedgerError as exc:
            return PlainTextResponse(f"503: not recorded: {exc.message}", status_code=503)
        return PlainTextResponse(done[0].note)
