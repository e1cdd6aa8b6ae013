"""The inbox's Starlette application: the queue, the case pages and the answer forms.

Pages are Jinja2 templates (autoescaped) shipped in the package; the queue page refreshes
its rows by polling a fragment that answers 204 while the snapshot is unchanged.  Every
request passes the :class:`~stepledger.inbox.auth.TokenGate`; every form post is checked
for its CSRF token.  Reads and appends block (DuckDB, Kafka), so they run in the
threadpool, never on the event loop.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from stepledger import wire
from stepledger.domain.approvals import AuthMethod
from stepledger.errors import (
    AlreadyAnsweredError,
    InvalidAnswerError,
    LedgerStateError,
    StepLedgerError,
    UnknownEscalationError,
    ViewStoreError,
)
from stepledger.humanqueue import queue as q
from stepledger.humanqueue.after import what_next
from stepledger.humanqueue.answers import Answerer, Receipt, answer_kind, parse_result
from stepledger.humanqueue.cases import Answer, Case, CaseKind
from stepledger.inbox import access, formats
from stepledger.inbox.auth import (
    CSRF_FIELD,
    SESSION_TTL_S,
    Credentials,
    GateConfig,
    Sessions,
    TokenGate,
    check_csrf,
    csrf_token,
    identity_of,
    new_token,
    session_id,
)
from stepledger.inbox.budget import BudgetRaises
from stepledger.inbox.controls import Controls
from stepledger.inbox.filters import an_id, query_without_page, read_filter
from stepledger.inbox.restarts import Restarts
from stepledger.inbox.roles import Action
from stepledger.inbox.timeline import case_timeline
from stepledger.inbox.users import User
from stepledger.readers.lake import LakeSource
from stepledger.resolution.registry import ToolRegistry

_HERE = Path(__file__).parent
NAME_COOKIE = "stepledger_inbox_name"


@dataclass(frozen=True)
class InboxConfig:
    """How one inbox serves: which projection it reads and who may open it."""

    db_path: Path
    """The projector's DuckDB file; its published snapshot is what is read."""
    token: str | None
    """The shared inbox token (URL once, traded for a session; or a bearer header)."""
    users: Mapping[str, User] = field(default_factory=dict)
    """The users file's people (token hashes, fleets, roles): answers record the name."""
    proxy_header: str | None = None
    """A header naming the user, set by a reverse proxy the operator trusts."""
    serves: frozenset[str] | None = None
    """The fleets served (a fleet's inbox config pins one); None: every fleet of the log."""
    session_ttl_s: float = SESSION_TTL_S
    """How long a browser session lives."""
    prefix: str = field(default_factory=lambda: "/s/" + secrets.token_urlsafe(12))
    """The random path the pages live under: the session cookie is scoped to it."""
    csrf_secret: str = field(default_factory=new_token, repr=False)
    """What forms' CSRF tokens are derived from (per process)."""
    port: int = 0
    """The port served on (names the cookie, so two inboxes on one host do not clash)."""
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    """Host headers accepted (a DNS-rebinding page gets 400)."""
    page_size: int = q.PAGE_SIZE
    """Cases per queue page."""
    poll_ms: int = 1500
    """How often the queue page asks whether the snapshot changed."""
    lake: LakeSource | None = None
    """The lake the projectors commit to, read instead of ``db_path`` when given."""


def create_app(
    config: InboxConfig, answerer: Answerer, tools: ToolRegistry | None = None
) -> Starlette:
    """The inbox application over a projection, answering through ``answerer``; ``tools``
    run the compensations a restart makes first."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    env = templates.env
    env.filters.update(formats.FILTERS)
    env.globals["case_url"] = case_url
    env.globals["case_timeline"] = case_timeline
    pages = _Pages(config, answerer, templates)
    routes = [
        Route("/", pages.queue),
        Route("/queue/rows", pages.rows),
        Route("/escalations/{escalation_id}", pages.escalation, methods=["GET", "POST"]),
        Route("/approval", pages.approval, methods=["GET", "POST"]),
        Route("/health", pages.health),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    routes.append(Route("/logout", pages.logout, methods=["POST"]))
    control = Controls(answerer, config.csrf_secret).control
    routes.append(Route("/workflows/{workflow_id}/control", control, methods=["POST"]))
    restart = Restarts(answerer, config.csrf_secret, templates, tools).restart
    routes.append(Route("/workflows/{workflow_id}/restart", restart, methods=["POST"]))
    raises = BudgetRaises(answerer, config.csrf_secret).raise_budget
    routes.append(Route("/budget/raise", raises, methods=["POST"]))
    gate = GateConfig(
        credentials=Credentials(config.token, config.users),
        sessions=Sessions(config.session_ttl_s),
        cookie=session_cookie(config.port),
        prefix=config.prefix,
        proxy_header=config.proxy_header,
        serves=config.serves,
    )
    pages.gate = gate
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=list(config.allowed_hosts)),
        Middleware(TokenGate, config=gate),
    ]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.pages = pages
    return app


def session_cookie(port: int) -> str:
    """The session cookie's name (it names the port: two inboxes on one host do not clash)."""
    return f"stepledger_inbox_{port}"


def warm(app: Starlette) -> None:
    """Compile the templates and open the snapshot before the first person asks."""
    pages: _Pages = app.state.pages
    for name in ("queue.html", "_rows.html", "case.html", "_timeline.html", "missing.html"):
        pages.templates.get_template(name)
    with contextlib.suppress(ViewStoreError):  # no projection yet: the page says so
        pages.source.page(q.QueueFilter())


class _Pages:
    """The endpoints, sharing the config, the answerer and the templates."""

    def __init__(self, config: InboxConfig, answerer: Answerer, templates: Jinja2Templates):
        self.config = config
        self.answerer = answerer
        self.templates = templates
        self.source = q.QueueSource(config.lake or config.db_path, config.page_size)
        self.gate: GateConfig | None = None

    async def health(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        refusal = check_csrf(request, form.get(CSRF_FIELD), self.config.csrf_secret)
        if refusal is not None:
            return PlainTextResponse(f"403: {refusal}", status_code=403)
        assert self.gate is not None
        self.gate.sessions.revoke(session_id(request, self.gate.cookie))
        response = PlainTextResponse("signed out: this session is closed")
        response.delete_cookie(self.gate.cookie, path=self.config.prefix + "/")
        return response

    async def queue(self, request: Request) -> Response:
        wanted, problem = read_filter(request.query_params, identity_of(request).grant.fleets)
        context = await run_in_threadpool(self._queue_context, wanted, problem)
        # A filter that could not be read is the asker's mistake: 400, the default shown.
        status = 400 if problem is not None else 200
        return self._render(request, "queue.html", context, status_code=status)

    async def rows(self, request: Request) -> Response:
        version = await run_in_threadpool(self.source.version)
        wanted, problem = read_filter(request.query_params, identity_of(request).grant.fleets)
        if problem is not None:
            return PlainTextResponse(f"400: {problem}", status_code=400)
        if request.query_params.get("v") == version:
            return Response(status_code=204)
        context = await run_in_threadpool(self._queue_context, wanted, problem)
        response = self._render(request, "_rows.html", context)
        response.headers[wire.INBOX_VERSION_HEADER] = version
        return response

    def _queue_context(self, wanted: q.QueueFilter, problem: str | None) -> dict[str, Any]:
        version = self.source.version()
        try:
            page: q.QueuePage | None = self.source.page(wanted)
        except ViewStoreError as exc:
            page, problem = None, problem or f"no projection to read yet: {exc.message}"
        return {
            "page": page,
            "wanted": wanted,
            "problem": problem,
            "version": version,
            "poll_ms": self.config.poll_ms,
            "query": query_without_page(wanted),
        }

    async def escalation(self, request: Request) -> Response:
        escalation_id = request.path_params["escalation_id"]
        workflow_id = await run_in_threadpool(self._workflow_of, escalation_id)
        if workflow_id is None:
            return self._missing(
                request,
                f"escalation {escalation_id} is not in the projection "
                "yet (or never was): reload in a moment",
            )
        case = await run_in_threadpool(self.answerer.escalation_case, workflow_id, escalation_id)
        refusal = _not_theirs(request, case)
        if refusal is not None:
            return refusal
        if request.method == "POST" and case is not None:
            return await self._answer(request, workflow_id, escalation_id)
        return self._case(request, case, f"escalation {escalation_id}")

    async def approval(self, request: Request) -> Response:
        source = request.query_params
        if request.method == "POST":
            form = await request.form()
            workflow_id, step_id = str(form.get("workflow", "")), str(form.get("step", ""))
            if not an_id(workflow_id) or not an_id(step_id):
                return PlainTextResponse(
                    "400: an approval is answered for a workflow and a step (form fields "
                    "'workflow' and 'step', 1-200 characters)",
                    status_code=400,
                )
        else:
            workflow_id, step_id = source.get("workflow", ""), source.get("step", "")
            if not an_id(workflow_id) or not an_id(step_id):
                return self._missing(request, "an approval is named by ?workflow=...&step=...")
        case = await run_in_threadpool(self.answerer.approval_case, workflow_id, step_id)
        refusal = _not_theirs(request, case)
        if refusal is not None:
            return refusal
        name = f"approval of {workflow_id}/{step_id}"
        if request.method == "POST" and case is not None:
            return await self._answer(request, workflow_id, None, step_id=step_id)
        if case is None and request.method == "POST":
            return self._missing(request, f"{name}: the step awaits no approval")
        return self._case(request, case, name)

    def _workflow_of(self, escalation_id: str) -> str | None:
        try:
            return self.source.workflow_of(escalation_id)
        except ViewStoreError:
            return None

    def _case(self, request: Request, case: Case | None, name: str, **extra: Any) -> Response:
        if case is None:
            return self._missing(request, f"no {name} in the log")
        status = extra.pop("status_code", 200)
        answered = request.query_params.get("answered")
        context = {
            "case": case,
            "next": what_next(case),
            "csrf_field": CSRF_FIELD,
            "answered": answered,
            "name": request.cookies.get(NAME_COOKIE, ""),
            "identity": identity_of(request),
            "form": {},
            "error": None,
            "refusal": None,
            # The workflow's controls are shown to an operator of its fleet only (the
            # control endpoint checks the same grant again).
            "controls": identity_of(request).grant.refusal(Action.CONTROL, case.fleet_id) is None,
            **extra,
        }
        return self._render(request, "case.html", context, status_code=status)

    async def _answer(
        self, request: Request, workflow_id: str, escalation_id: str | None, step_id: str = ""
    ) -> Response:
        form = await request.form()
        refusal = check_csrf(request, form.get(CSRF_FIELD), self.config.csrf_secret)
        if refusal is not None:
            return PlainTextResponse(f"403: {refusal}", status_code=403)
        fields = {k: str(form.get(k, "")) for k in ("answer", "by", "note", "result", "digest")}
        who = identity_of(request)
        if who.proven:
            fields["by"] = who.name  # the authenticated name, never a typed one
        try:
            receipt = await run_in_threadpool(
                self._append, workflow_id, escalation_id, step_id, fields, who.auth
            )
        except (InvalidAnswerError, AlreadyAnsweredError, UnknownEscalationError) as exc:
            return await self._refused(request, workflow_id, escalation_id, step_id, fields, exc)
        except LedgerStateError as exc:
            # The log forbids it (the step never asked, the call changed): the asker's to fix.
            return await self._refused(request, workflow_id, escalation_id, step_id, fields, exc)
        except StepLedgerError as exc:
            return PlainTextResponse(
                f"503: the answer was not recorded: {exc.message}", status_code=503
            )
        target = request.scope.get("root_path", "") + _case_url(receipt.case)
        target += ("&" if "?" in target else "?") + "answered=" + receipt.event.event_id
        response = RedirectResponse(target, status_code=303)
        if not who.proven:
            response.set_cookie(
                NAME_COOKIE,
                fields["by"].strip(),
                samesite="strict",
                httponly=True,
                path=self.config.prefix + "/",
            )
        return response

    def _append(
        self,
        workflow_id: str,
        escalation_id: str | None,
        step_id: str,
        fields: dict[str, str],
        auth: AuthMethod,
    ) -> Receipt:
        try:
            answer = Answer(fields["answer"])
        except ValueError:
            raise InvalidAnswerError(f"unknown answer {fields['answer']!r}") from None
        kind = answer_kind(answer)
        if escalation_id is None:
            if not isinstance(kind, bool):
                raise InvalidAnswerError("an approval is answered with approve or deny")
            return self.answerer.answer_approval(
                workflow_id,
                step_id,
                granted=kind,
                by=fields["by"],
                note=fields["note"],
                digest=fields["digest"] or None,
                auth=auth,
            )
        if isinstance(kind, bool):
            raise InvalidAnswerError("an escalation is answered with a verdict")
        result = parse_result(fields["result"]) if answer is Answer.HAPPENED else None
        if fields["result"].strip() and answer is not Answer.HAPPENED:
            raise InvalidAnswerError("a result goes only with 'happened'")
        return self.answerer.answer_escalation(
            workflow_id,
            escalation_id,
            kind,
            by=fields["by"],
            note=fields["note"],
            result=result,
            auth=auth,
        )

    async def _refused(
        self,
        request: Request,
        workflow_id: str,
        escalation_id: str | None,
        step_id: str,
        fields: dict[str, str],
        exc: StepLedgerError,
    ) -> Response:
        if escalation_id is None:
            case = await run_in_threadpool(self.answerer.approval_case, workflow_id, step_id)
        else:
            case = await run_in_threadpool(
                self.answerer.escalation_case, workflow_id, escalation_id
            )
        if case is None:
            return self._missing(request, exc.message)
        if isinstance(exc, AlreadyAnsweredError | LedgerStateError):
            return self._case(request, case, "case", refusal=exc.message, status_code=409)
        status = 404 if isinstance(exc, UnknownEscalationError) else 400
        return self._case(request, case, "case", error=exc.message, form=fields, status_code=status)

    def _missing(self, request: Request, text: str) -> Response:
        return self._render(request, "missing.html", {"text": text}, status_code=404)

    def _render(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        context = {
            "base": request.scope.get("root_path", ""),
            "csrf": csrf_token(self.config.csrf_secret),
            "who": identity_of(request),
            **context,
        }
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)


def _not_theirs(request: Request, case: Case | None) -> Response | None:
    """A 403 when the case is of a fleet the person does not act for (before anything else)."""
    action = Action.ANSWER if request.method == "POST" else Action.SEE
    return None if case is None else access.refused(request, action, case.fleet_id)


def case_url(kind: str, case_id: str | None, workflow_id: str, step_id: str | None) -> str:
    """Where a case's page is (escalations by id; approvals by workflow and step)."""
    if kind == "approval" or case_id is None:
        return "/approval?" + urlencode({"workflow": workflow_id, "step": step_id or ""})
    return f"/escalations/{case_id}"


def _case_url(case: Case) -> str:
    if case.kind is CaseKind.APPROVAL:
        return case_url("approval", None, case.workflow_id, case.step_id)
    return case_url("escalation", case.case_id, case.workflow_id, case.step_id)
