"""OpenTelemetry traces: one trace per workflow, a span per step, across every process.

Only ``opentelemetry-api`` is used, and only if it is installed (the ``otel`` extra); with no
tracer provider configured every span is a no-op.  Spans, all under the tracer
``stepledger``:

- ``stepledger.step TOOL``: one step call in the SDK, with span events ``intent acknowledged``
  and ``outcome recorded``; a step the log already settled is *replayed*
  (``stepledger.replayed=true``) and has no call span: a replay is never a second call.
- ``stepledger.call TOOL``: the tool call itself, a child of its step span.
- ``stepledger.workflow.open``: opening a workflow (its first run or a resume), sync or asyncio.
- ``stepledger.decision ACTION``: a resolution of a step in doubt (recovery daemon, or a
  resume settling a step), a child of the step's span when the intent's ``traceparent``
  is known, linked to it, and in the workflow's trace in any case.

Every span of a workflow is in one trace whose id is derived from the workflow id, so the
agent that crashed, the one that resumed and the daemon that decided hours later write into
the same trace without reading each other (the parent of a process's top spans is a virtual
workflow span, never exported).  A caller's own span (a web request, say) is linked.  Each
event appended while a span is current carries its W3C ``traceparent`` header.  Until an
SDK tracer provider is set, nothing is traced and no header is added.

Attributes: ``stepledger.workflow_id``, ``stepledger.step_id``, ``stepledger.tool``,
``stepledger.attempt``, ``stepledger.policy``, ``stepledger.idempotency_key``,
``stepledger.replayed``, ``stepledger.decision``, ``stepledger.event_type``; a model turn's
step span adds its usage by OpenTelemetry's GenAI conventions (``gen_ai.response.model``,
``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
``gen_ai.usage.cache_read.input_tokens``, ``gen_ai.usage.reasoning.output_tokens``) and
``stepledger.model.cost``, with ``stepledger.replayed=true`` on a turn replayed from the log.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import inspect
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

try:
    from opentelemetry import trace as _otel
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the otel extra is optional
    _otel = None  # type: ignore[assignment]

from stepledger import wire
from stepledger.domain.usage import usage_of

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from stepledger.domain.events import Event
    from stepledger.domain.state import StepState
    from stepledger.domain.usage import TurnUsage

F = TypeVar("F", bound=Callable[..., Any])

Headers = list[tuple[str, bytes | None]]
"""A record's headers as the event log writes and reads them (``stepledger.kafka.Headers``)."""


class Position(Protocol):
    """Where a record landed (``stepledger.kafka.Position`` is one): what a span notes."""

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


WORKFLOW_ID = "stepledger.workflow_id"
STEP_ID = "stepledger.step_id"
TOOL = "stepledger.tool"
ATTEMPT = "stepledger.attempt"
POLICY = "stepledger.policy"
IDEMPOTENCY_KEY = "stepledger.idempotency_key"
REPLAYED = "stepledger.replayed"
DECISION = "stepledger.decision"
EVENT_TYPE = "stepledger.event_type"
PIPELINED = "stepledger.pipelined"
COST = "stepledger.model.cost"
GEN_AI_MODEL = "gen_ai.response.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_CACHED_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"

#: The step span current in this context (set only inside ``stepledger.step``).
_STEP: contextvars.ContextVar[Span | None] = contextvars.ContextVar("stepledger_step", default=None)
#: The most intents' trace contexts a process keeps for later decisions.
_REMEMBERED = 100_000


def enabled() -> bool:
    """Whether the OpenTelemetry API is installed (spans may still be no-ops)."""
    return _otel is not None


def _provider() -> TracerProvider | None:
    assert _otel is not None
    return _otel.get_tracer_provider()


_DEFAULT_PROVIDER = _provider
#: The environment variable that makes the OpenTelemetry API load a provider by name.
_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"


class _EnvProvider:
    """Whether the environment names a provider, read at most once a second."""

    checked_at = -1.0
    named = False

    @classmethod
    def named_now(cls) -> bool:
        now = time.monotonic()
        if now - cls.checked_at >= 1.0:
            cls.checked_at, cls.named = now, _PROVIDER_ENV in os.environ
        return cls.named


def _none_configured() -> bool:
    """True when certainly no provider is set: cheap enough for every step.

    ``get_tracer_provider`` reads the environment on every call until a provider is set
    (four calls a step); here the API's own global says whether code set one,
    and the environment is read at most once a second.
    """
    if _provider is not _DEFAULT_PROVIDER or getattr(_otel, "_TRACER_PROVIDER", 0) is not None:
        return False
    return not _EnvProvider.named_now()


def _active() -> bool:
    """Whether an SDK provider is configured: without one nothing is traced, at no cost.

    The API's default (proxy) provider would still hand out the workflow's context, so
    every event would carry a ``traceparent`` naming a span nobody records.
    """
    if _otel is None or _none_configured():
        return False
    provider = _provider()
    return provider is not None and not isinstance(
        provider, _otel.ProxyTracerProvider | _otel.NoOpTracerProvider
    )


def _tracer() -> Tracer:
    provider = _provider()
    assert provider is not None
    return _tracer_of(provider)


@functools.lru_cache(maxsize=4)
def _tracer_of(provider: TracerProvider) -> Tracer:
    # The SDK builds a new tracer per call (measured: the largest cost of a step's spans).
    return provider.get_tracer(wire.TRACER_NAME)


@functools.lru_cache(maxsize=4096)
def workflow_context(workflow_id: str) -> Context:
    """The context of a workflow's virtual root span: the same in every process."""
    assert _otel is not None
    digest = hashlib.sha256(b"stepledger/workflow\0" + workflow_id.encode()).digest()
    parent = _otel.SpanContext(
        trace_id=int.from_bytes(digest[:16]) or 1,
        span_id=int.from_bytes(digest[16:24]) or 1,
        is_remote=True,
        trace_flags=_otel.TraceFlags(_otel.TraceFlags.SAMPLED),
    )
    return _otel.set_span_in_context(_otel.NonRecordingSpan(parent))


def workflow_trace_id(workflow_id: str) -> int:
    """The trace id every span of this workflow carries."""
    assert _otel is not None
    return _otel.get_current_span(workflow_context(workflow_id)).get_span_context().trace_id


def _caller_links() -> list[Any]:
    assert _otel is not None
    current = _otel.get_current_span().get_span_context()
    return [_otel.Link(current)] if current.is_valid else []


@contextlib.contextmanager
def _span(name: str, workflow_id: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
    # A span already of this workflow (a step inside an open, a call inside a step) nests
    # under it; anything else (a caller's request span) is linked, not a parent.
    assert _otel is not None
    current = _otel.get_current_span().get_span_context()
    ours = current.is_valid and current.trace_id == workflow_trace_id(workflow_id)
    with _tracer().start_as_current_span(
        name,
        context=None if ours else workflow_context(workflow_id),
        links=[] if ours else _caller_links(),
        attributes={WORKFLOW_ID: workflow_id, **attributes},
    ) as span:
        yield span


def traced_step(method: F) -> F:
    """Decorate ``Workflow.step``/``astep``: the call runs inside its ``stepledger.step`` span."""
    if _otel is None:
        return method

    def attributes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
        # Never the reason a call fails: a call the method itself refuses is traced as given.
        step_id = args[0] if args else kwargs.get("step_id", "")
        tool = args[1] if len(args) > 1 else kwargs.get("tool")
        return str(step_id), tool

    @contextlib.contextmanager
    def step_span(workflow_id: str, step_id: str, tool: Any) -> Iterator[None]:
        name = str(getattr(tool, "name", "?"))
        policy = getattr(getattr(tool, "resolution", None), "value", "")
        attrs = {STEP_ID: step_id, TOOL: name, POLICY: str(policy)}
        with _span(f"stepledger.step {name}", workflow_id, attrs) as span:
            token = _STEP.set(span)
            try:
                yield
            finally:
                _STEP.reset(token)

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def astep(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not _active():
                return await method(self, *args, **kwargs)
            with step_span(self.workflow_id, *attributes(args, kwargs)):
                return await method(self, *args, **kwargs)

        return astep  # type: ignore[return-value]

    @functools.wraps(method)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _active():
            return method(self, *args, **kwargs)
        with step_span(self.workflow_id, *attributes(args, kwargs)):
            return method(self, *args, **kwargs)

    return step  # type: ignore[return-value]


def traced_open(fn: F) -> F:
    """Decorate ``open_workflow``: opening a workflow is a ``stepledger.workflow.open`` span."""
    if _otel is None:
        return fn

    @functools.wraps(fn)
    def opened(ledger: Any, workflow_id: str, *args: Any, **kwargs: Any) -> Any:
        if not _active():
            return fn(ledger, workflow_id, *args, **kwargs)
        with _span("stepledger.workflow.open", workflow_id, {}) as span:
            workflow = fn(ledger, workflow_id, *args, **kwargs)
            span.set_attribute(ATTEMPT, int(getattr(workflow, "attempt", 0)))
            return workflow

    return opened  # type: ignore[return-value]


def traced_aopen(fn: F) -> F:
    """Decorate ``aopen_workflow``: the same ``stepledger.workflow.open`` span, for a coroutine."""
    if _otel is None:
        return fn

    @functools.wraps(fn)
    async def opened(ledger: Any, workflow_id: str, *args: Any, **kwargs: Any) -> Any:
        if not _active():
            return await fn(ledger, workflow_id, *args, **kwargs)
        with _span("stepledger.workflow.open", workflow_id, {}) as span:
            workflow = await fn(ledger, workflow_id, *args, **kwargs)
            span.set_attribute(ATTEMPT, int(getattr(workflow, "attempt", 0)))
            return workflow

    return opened  # type: ignore[return-value]


def call_attempt(attempt: int, idempotency_key: str) -> None:
    """Name the attempt and key of the step span current here (a call about to be made)."""
    span = _STEP.get()
    if span is not None:
        span.set_attributes({ATTEMPT: attempt, IDEMPOTENCY_KEY: idempotency_key})


def replayed(step: StepState | None) -> None:
    """Mark the current step span a replay: its outcome came from the log, nothing was called."""
    span = _STEP.get()
    if span is None:
        return
    span.set_attribute(REPLAYED, True)
    if step is not None:
        span.set_attributes({ATTEMPT: step.attempt, IDEMPOTENCY_KEY: step.idempotency_key or ""})
        if step.tool == wire.MODEL_STEP_TOOL:
            model_usage(usage_of(step.result_json), replayed=True)


def model_usage(usage: TurnUsage | None, *, replayed: bool) -> None:
    """Put a model turn's usage on the current step span (GenAI semantic conventions).

    A replayed turn carries the usage it was recorded with and ``stepledger.replayed``:
    a backend summing ``gen_ai.usage.*`` over spans must leave replayed ones out.
    """
    span = _STEP.get()
    if span is None or usage is None:
        return
    attrs: dict[str, Any] = {
        GEN_AI_INPUT_TOKENS: usage.input_tokens,
        GEN_AI_OUTPUT_TOKENS: usage.output_tokens,
        GEN_AI_CACHED_TOKENS: usage.cached_tokens,
        GEN_AI_REASONING_TOKENS: usage.reasoning_tokens,
        REPLAYED: replayed,
    }
    if usage.model:
        attrs[GEN_AI_MODEL] = usage.model
    if usage.cost is not None:
        attrs[COST] = usage.cost
    span.set_attributes(attrs)


def recorded(event: Event, position: Position) -> None:
    """Note on the current step span that one of its events is durable in the log."""
    span = _STEP.get()
    if span is None:
        return
    kind = event.type
    name = {"step_intended": "intent acknowledged", "step_outcome": "outcome recorded"}.get(
        kind, kind
    )
    attrs: dict[str, Any] = {
        EVENT_TYPE: kind,
        "messaging.kafka.partition": position.partition,
        "messaging.kafka.offset": position.offset,
        **_status(event),
    }
    span.add_event(name, attrs)


def _status(event: Event) -> dict[str, str]:
    """The ``stepledger.status`` attribute of an event whose body has a status."""
    status = getattr(event.body, "status", None)
    return {} if status is None else {"stepledger.status": str(getattr(status, "value", status))}


def sent(event: Event) -> None:
    """Note on the current step span that its outcome left unacknowledged (pipelined outcomes).

    Its acknowledgement comes during the next event's wait, in another span: this span
    says only that the outcome was handed to the producer.
    """
    span = _STEP.get()
    if span is None:
        return
    span.add_event("outcome sent", {EVENT_TYPE: event.type, PIPELINED: True, **_status(event)})


def traced_call(run: Callable[..., Any], tool: str) -> Callable[..., Any]:
    """The tool's run hook inside a ``stepledger.call`` span (async stays async)."""
    if not _active():
        return run
    name = f"stepledger.call {tool}"

    def attributes() -> dict[str, Any]:
        step = _STEP.get()
        found = getattr(step, "attributes", None) or {}
        return {k: v for k, v in found.items() if k.startswith("stepledger.")}

    if inspect.iscoroutinefunction(run):

        @functools.wraps(run)
        async def acall(*args: Any, **kwargs: Any) -> Any:
            with _tracer().start_as_current_span(name, attributes=attributes()):
                return await run(*args, **kwargs)

        return acall

    @functools.wraps(run)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _tracer().start_as_current_span(name, attributes=attributes()):
            return run(*args, **kwargs)

    return call


def trace_headers() -> Headers:
    """The W3C ``traceparent`` of the current span, as a header (none without a valid span)."""
    if _otel is None or not _active():
        return []
    context = _otel.get_current_span().get_span_context()
    if not context.is_valid:
        return []
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    value = carrier.get(wire.TRACEPARENT_HEADER)
    return [] if value is None else [(wire.TRACEPARENT_HEADER, value.encode())]


class _Remembered:
    """The ``traceparent`` of recent intents, so a decision can name the step's span."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: tuple[str, str], value: str) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def get(self, key: tuple[str, str]) -> str | None:
        with self._lock:
            return self._items.get(key)


_intents = _Remembered(_REMEMBERED)


def remember_intent(event: Event, headers: Headers) -> None:
    """Keep an intent's ``traceparent`` (from its record's headers) for a later decision.

    A record without the header, or with one that is not a traceparent, is simply not
    remembered.
    """
    if event.step_id is None or event.type != "step_intended" or not _active():
        return
    for key, value in headers:
        if key == wire.TRACEPARENT_HEADER and isinstance(value, bytes):
            _intents.put((event.workflow_id, event.step_id), value.decode(errors="replace"))
            return


@contextlib.contextmanager
def decision_span(workflow_id: str, step_id: str, decision: str) -> Iterator[None]:
    """A ``stepledger.decision`` span: a child of and linked to the step's span if known."""
    if _otel is None or not _active():
        yield
        return
    attrs = {WORKFLOW_ID: workflow_id, STEP_ID: step_id, DECISION: decision}
    current = _otel.get_current_span().get_span_context()
    # Inside a span of this workflow (a resume settling a step): nest under it.
    ours = current.is_valid and current.trace_id == workflow_trace_id(workflow_id)
    parent: Context | None = None if ours else workflow_context(workflow_id)
    links = []
    remembered = _intents.get((workflow_id, step_id))
    if remembered is not None:
        step = TraceContextTextMapPropagator().extract({wire.TRACEPARENT_HEADER: remembered})
        step_context = _otel.get_current_span(step).get_span_context()
        if step_context.is_valid:
            parent, links = step, [_otel.Link(step_context, {"stepledger.link": "intent"})]
    with _tracer().start_as_current_span(
        f"stepledger.decision {decision}", context=parent, links=links, attributes=attrs
    ):
        yield
