"""The inbox's Starlette application: the queue, the case pages and the answer forms.

Pages are Jinja2 templates (autoescaped) shipped in the package; the queue page refreshes
its rows by polling a fragment that answers 204 while the snapshot is unchanged.  Every
request passes the :class:`~stepledger.inbox.auth.TokenGate`; every form post is checked
for its CSRF token.  Reads and appends block (DuckDB, Kafka), so they run in the
threadpool, never on the event loop.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
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
from stepledger.errors import (
    AlreadyAnsweredError,
    InvalidAnswerError,
    StepLedgerError,
    UnknownEscalationError,
    ViewStoreError,
)
from stepledger.inbox import queue as q
from stepledger.inbox.answers import Answerer, Receipt, answer_kind, parse_result
from stepledger.inbox.auth import CSRF_FIELD, TokenGate, check_csrf, csrf_token
from stepledger.inbox.cases import Answer, Case, CaseKind
from stepledger.inbox.timeline import case_timeline

_HERE = Path(__file__).parent
NAME_COOKIE = "stepledger_inbox_name"


@dataclass(frozen=True)
class InboxConfig:
    """How one inbox serves: which projection it reads and the token it asks for."""

    db_path: Path
    """The projector's DuckDB file; its published snapshot is what is read."""
    token: str
    """Every request must carry it (URL once, then a cookie; or a bearer header)."""
    port: int = 0
    """The port served on (names the cookie, so two inboxes on one host do not clash)."""
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    """Host headers accepted (a DNS-rebinding page gets 400)."""
    page_size: int = q.PAGE_SIZE
    """Cases per queue page."""
    poll_ms: int = 1500
    """How often the queue page asks whether the snapshot changed."""


def create_app(config: InboxConfig, answerer: Answerer) -> Starlette:
    """The inbox application over a projection, answering through ``answerer``."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    env = templates.env
    env.filters.update(pretty=_pretty, ago=_ago, when=_when, label=_label)
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
    cookie = f"stepledger_inbox_{config.port}"
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=list(config.allowed_hosts)),
        Middleware(TokenGate, token=config.token, cookie=cookie),
    ]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.pages = pages
    return app


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
        self.source = q.QueueSource(config.db_path, config.page_size)

    async def health(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def queue(self, request: Request) -> Response:
        wanted, problem = _filter(request)
        context = await run_in_threadpool(self._queue_context, wanted, problem)
        return self._render(request, "queue.html", context)

    async def rows(self, request: Request) -> Response:
        version = await run_in_threadpool(q.snapshot_version, self.config.db_path)
        if request.query_params.get("v") == version:
            return Response(status_code=204)
        wanted, problem = _filter(request)
        context = await run_in_threadpool(self._queue_context, wanted, problem)
        response = self._render(request, "_rows.html", context)
        response.headers[wire.INBOX_VERSION_HEADER] = version
        return response

    def _queue_context(self, wanted: q.QueueFilter, problem: str | None) -> dict[str, Any]:
        version = q.snapshot_version(self.config.db_path)
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
            "query": _query_without_page(wanted),
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
        if request.method == "POST":
            return await self._answer(request, workflow_id, escalation_id)
        case = await run_in_threadpool(self.answerer.escalation_case, workflow_id, escalation_id)
        return self._case(request, case, f"escalation {escalation_id}")

    async def approval(self, request: Request) -> Response:
        source = request.query_params
        if request.method == "POST":
            form = await request.form()
            workflow_id, step_id = str(form.get("workflow", "")), str(form.get("step", ""))
            return await self._answer(request, workflow_id, None, step_id=step_id)
        workflow_id, step_id = source.get("workflow", ""), source.get("step", "")
        case = await run_in_threadpool(self.answerer.approval_case, workflow_id, step_id)
        return self._case(request, case, f"approval of {workflow_id}/{step_id}")

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
            "csrf": csrf_token(self.config.token),
            "csrf_field": CSRF_FIELD,
            "answered": answered,
            "name": request.cookies.get(NAME_COOKIE, ""),
            "form": {},
            "error": None,
            "refusal": None,
            **extra,
        }
        return self._render(request, "case.html", context, status_code=status)

    async def _answer(
        self, request: Request, workflow_id: str, escalation_id: str | None, step_id: str = ""
    ) -> Response:
        form = await request.form()
        refusal = check_csrf(request, form.get(CSRF_FIELD), self.config.token)
        if refusal is not None:
            return PlainTextResponse(f"403: {refusal}", status_code=403)
        fields = {k: str(form.get(k, "")) for k in ("answer", "by", "note", "result")}
        try:
            receipt = await run_in_threadpool(
                self._append, workflow_id, escalation_id, step_id, fields
            )
        except (InvalidAnswerError, AlreadyAnsweredError, UnknownEscalationError) as exc:
            return await self._refused(request, workflow_id, escalation_id, step_id, fields, exc)
        except StepLedgerError as exc:
            return PlainTextResponse(
                f"503: the answer was not recorded: {exc.message}", status_code=503
            )
        target = _case_url(receipt.case)
        target += ("&" if "?" in target else "?") + "answered=" + receipt.event.event_id
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(NAME_COOKIE, fields["by"].strip(), samesite="strict", httponly=True)
        return response

    def _append(
        self, workflow_id: str, escalation_id: str | None, step_id: str, fields: dict[str, str]
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
                workflow_id, step_id, granted=kind, by=fields["by"], note=fields["note"]
            )
        if isinstance(kind, bool):
            raise InvalidAnswerError("an escalation is answered with a verdict")
        result = parse_result(fields["result"]) if answer is Answer.HAPPENED else None
        if fields["result"].strip() and answer is not Answer.HAPPENED:
            raise InvalidAnswerError("a result goes only with 'happened'")
        return self.answerer.answer_escalation(
            workflow_id, escalation_id, kind, by=fields["by"], note=fields["note"], result=result
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
        if isinstance(exc, AlreadyAnsweredError):
            return self._case(request, case, "case", refusal=exc.message, status_code=409)
        status = 404 if isinstance(exc, UnknownEscalationError) else 400
        return self._case(request, case, "case", error=exc.message, form=fields, status_code=status)

    def _missing(self, request: Request, text: str) -> Response:
        return self._render(request, "missing.html", {"text": text}, status_code=404)

    def _render(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)


def _filter(request: Request) -> tuple[q.QueueFilter, str | None]:
    params = request.query_params
    problem = None
    try:
        older = q.parse_age(params.get("age", ""))
    except ValueError as exc:
        older, problem = None, str(exc)
    try:
        page = int(params.get("page", "1") or 1)
        kind = q.KindFilter(params.get("kind", ""))
        order = q.Order(params.get("order", "newest") or "newest")
    except ValueError:
        page, kind, order = 1, q.KindFilter.ALL, q.Order.NEWEST
        problem = problem or "unknown page, kind or order: showing the default"
    wanted = q.QueueFilter(
        fleet=params.get("fleet", ""),
        tool=params.get("tool", ""),
        workflow=params.get("workflow", "").strip(),
        older_than=older,
        kind=kind,
        order=order,
        page=page,
    )
    return wanted, problem


def _query_without_page(wanted: q.QueueFilter) -> str:
    age = "" if wanted.older_than is None else f"{int(wanted.older_than.total_seconds())}s"
    params = {
        "fleet": wanted.fleet,
        "tool": wanted.tool,
        "workflow": wanted.workflow,
        "age": age,
        "kind": wanted.kind.value,
        "order": wanted.order.value,
    }
    return urlencode({k: v for k, v in params.items() if v})


def case_url(kind: str, case_id: str | None, workflow_id: str, step_id: str | None) -> str:
    """Where a case's page is (escalations by id; approvals by workflow and step)."""
    if kind == "approval" or case_id is None:
        return "/approval?" + urlencode({"workflow": workflow_id, "step": step_id or ""})
    return f"/escalations/{case_id}"


def _case_url(case: Case) -> str:
    if case.kind is CaseKind.APPROVAL:
        return case_url("approval", None, case.workflow_id, case.step_id)
    return case_url("escalation", case.case_id, case.workflow_id, case.step_id)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "-"
    seconds = max(0.0, ((now or datetime.now(UTC)) - value).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _label(value: str) -> str:
    return value.replace("_", " ")
