"""Restart a workflow from a step in the inbox (operators of its fleet only), plan first.

``POST /workflows/{workflow_id}/restart`` with ``step``, an optional ``reason`` and the
form's CSRF token answers with the plan :func:`stepledger.domain.restart.plan` makes (what
it replays, what it compensates first, the new workflow's id), or with the refusal naming
the effects that stand and cannot be undone first (409, nothing written): what
``stepledger workflows restart ID --from STEP`` prints before ``--yes``.  The plan's page
carries a confirmation form bound to that very plan (its digest and the new id); posted,
the plan is made again from the log and carried through by
:func:`stepledger.humanqueue.operators.carry_restart`, the CLI's one restart path, only if
it is still the plan that was shown.  Compensations run here through the tools the inbox
was served with (``stepledger inbox --tools``); a plan that needs a tool this inbox lacks is
refused, naming the CLI command that carries it.  The same guard as every operator command
(:func:`stepledger.inbox.access.operator_form`: the role, then the CSRF token) stands
before anything is read, then the workflow's fleet as the log gives it.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.templating import Jinja2Templates

from stepledger.config import Settings
from stepledger.domain.restart import RestartPlan
from stepledger.errors import LedgerStateError, StepLedgerError
from stepledger.humanqueue.answers import Answerer
from stepledger.humanqueue.operators import carry_restart, plan_restart
from stepledger.inbox import access
from stepledger.inbox.auth import CSRF_FIELD, csrf_token, identity_of
from stepledger.inbox.controls import OperatorEndpoint
from stepledger.inbox.filters import an_id
from stepledger.inbox.roles import Action
from stepledger.log import KafkaEventLog
from stepledger.producer import Ledger
from stepledger.resolution.registry import ToolRegistry
from stepledger.terminal import shell_arg

MAX_REASON = 4000


class Restarts(OperatorEndpoint):
    """The restart endpoint over the inbox's log, history and tools."""

    def __init__(
        self,
        answerer: Answerer,
        csrf_secret: str,
        templates: Jinja2Templates,
        tools: ToolRegistry | None = None,
    ) -> None:
        super().__init__(answerer, csrf_secret)
        self.templates = templates
        self.tools = tools or ToolRegistry()

    async def restart(self, request: Request) -> Response:
        """Show the plan of a restart from the posted step, or carry a confirmed one out."""
        workflow_id = request.path_params["workflow_id"]
        form = await access.operator_form(request, self.csrf_secret)
        if isinstance(form, Response):
            return form
        step_id, new_id = str(form.get("step", "")), str(form.get("as", ""))
        if not an_id(step_id) or (new_id and not an_id(new_id)):
            return PlainTextResponse("400: name the step to restart from", status_code=400)
        try:
            state = await run_in_threadpool(self.operators.state, workflow_id)
        except LedgerStateError as exc:
            return PlainTextResponse(f"404: {exc.message}", status_code=404)
        denied = access.refused(request, Action.CONTROL, state.fleet_id)
        if denied is not None:
            return denied
        try:
            history = self.answerer.history
            plan = await run_in_threadpool(plan_restart, history, state, step_id, new_id)
        except StepLedgerError as exc:
            return _conflict(exc.message)
        if plan.refusal is not None:
            return _conflict(plan.refusal)
        reason = str(form.get("reason", ""))[:MAX_REASON]
        confirmed = str(form.get("confirm", ""))
        if not confirmed:
            return self._shown(request, plan, reason)
        if confirmed != plan.digest:
            return _conflict(
                f"the plan of restarting {workflow_id!r} from {step_id!r} changed since it "
                "was shown: look at it again"
            )
        lacking = self._lacking(plan)
        if lacking is not None:
            return _conflict(lacking)
        who = identity_of(request)
        why = f"{reason or 'restarted'} (by {who.name}, {who.auth.value})"
        try:
            done = await run_in_threadpool(self._carry, state.fleet_id, plan, why, who.name)
        except StepLedgerError as exc:
            return PlainTextResponse(f"503: not carried through: {exc.message}", 503)
        return PlainTextResponse(done)

    def _lacking(self, plan: RestartPlan) -> str | None:
        """Why this inbox cannot compensate what the plan undoes first (None: it can)."""
        missing = [s.tool for s in plan.undo if _no_compensation(self.tools, s.tool)]
        if not missing:
            return None
        return (
            f"the plan compensates first with {', '.join(sorted(set(missing)))}, which this "
            f"inbox has no tools for: serve it with --tools, or run `stepledger workflows "
            f"restart {shell_arg(plan.old)} --from {shell_arg(plan.step_id)} --tools ...`"
        )

    def _carry(self, fleet_id: str, plan: RestartPlan, reason: str, by: str) -> str:
        """Carry the restart out as a runner of the workflow's fleet (its own producer)."""
        log = self.answerer.log
        if isinstance(log, KafkaEventLog):
            settings = log.settings.model_copy(update={"fleet_id": fleet_id})
            with Ledger(settings, tools=self.tools) as ledger:
                return carry_restart(ledger, plan, reason, by=by)
        producer = self.answerer.factory.producer_id
        # In memory (the package's test double): the inbox's own log, left open.
        settings = Settings(fleet_id=fleet_id, producer_id=producer)
        return carry_restart(Ledger(settings, log=log, tools=self.tools), plan, reason, by=by)

    def _shown(self, request: Request, plan: RestartPlan, reason: str) -> Response:
        context = {
            "base": request.scope.get("root_path", ""),
            "csrf": csrf_token(self.csrf_secret),
            "csrf_field": CSRF_FIELD,
            "who": identity_of(request),
            "plan": plan,
            "reason": reason,
        }
        return self.templates.TemplateResponse(request, "restart.html", context)


def _no_compensation(tools: ToolRegistry, name: str) -> bool:
    tool = tools.get(name)
    return tool is None or tool.compensate is None


def _conflict(message: str) -> Response:
    """The log forbids it (or it changed): 409 in one line, nothing written."""
    return PlainTextResponse(f"409: {message}", status_code=409)
