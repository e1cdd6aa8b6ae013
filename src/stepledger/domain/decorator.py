"""``@stepledger.tool``: a plain function becomes a :class:`~stepledger.domain.tools.Tool`.

::

    @sl.tool(keyed=True, compensate=refund)
    def charge(amount: int, currency: str, *, idempotency_key: str) -> Receipt: ...

    receipt = wf.step("charge", charge, amount=1250, currency="EUR")

The step's arguments are the function's keyword arguments; the idempotency key is passed
as the keyword ``idempotency_key`` if the function declares it (a keyed tool must).  The
function's annotations type the arguments: recovery hands a re-drive the arguments as the
intent recorded them (JSON), and they are validated back into the declared types (a
``date`` comes back a ``date``); its return annotation is the result type a replay
returns (see :mod:`stepledger.domain.results`).  Hooks keep the one order every hook
has: ``compensate(args, idempotency_key, result)``, ``query(args, idempotency_key)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints, overload

from pydantic import TypeAdapter

from stepledger.domain.results import return_annotation
from stepledger.domain.tools import Tool
from stepledger.errors import ToolDefinitionError

KEY = "idempotency_key"


@overload
def tool(fn: Callable[..., Any], /, **spec: Any) -> Tool: ...


@overload
def tool(fn: None = None, /, **spec: Any) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, **spec: Any
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a Tool of a function: ``@tool`` or ``@tool(keyed=True, compensate=...)``.

    Keywords are :class:`Tool`'s fields (``name`` defaults to the function's name).
    """
    if fn is None:

        def decorate(f: Callable[..., Any]) -> Tool:
            return function_tool(f, **spec)

        return decorate
    return function_tool(fn, **spec)


def function_tool(fn: Callable[..., Any], **spec: Any) -> Tool:
    """The Tool whose ``run`` calls ``fn(**args, idempotency_key=key)``."""
    name = str(spec.pop("name", fn.__name__))
    signature = inspect.signature(fn)
    takes_key = KEY in signature.parameters
    if spec.get("keyed") and not takes_key:
        raise ToolDefinitionError(
            f"tool {name!r} is keyed: its function must take the keyword {KEY!r} and hand "
            "it to the service",
            tool=name,
        )
    coerce = _argument_types(fn, signature, name)

    def call(args: dict[str, Any], key: str) -> Any:
        kwargs = coerce(args)
        if takes_key:
            kwargs[KEY] = key
        return fn(**kwargs)

    run: Callable[[dict[str, Any], str], Any] = call
    if inspect.iscoroutinefunction(fn):
        # An async function stays one: ``astep`` awaits it, a recovery hook runs it to the end.
        async def arun(args: dict[str, Any], key: str) -> Any:
            return await call(args, key)

        run = arun

    if "result_type" not in spec:
        try:
            spec["result_type"] = return_annotation(fn)
        except NameError as exc:
            raise ToolDefinitionError(
                f"tool {name!r}: its return annotation cannot be resolved ({exc}); "
                "pass result_type= explicitly",
                tool=name,
            ) from None
    made = Tool(name=name, run=run, **spec)
    made.bind_function(fn)
    return made


def _argument_types(
    fn: Callable[..., Any], signature: inspect.Signature, name: str
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    try:
        hints = get_type_hints(fn)
    except NameError as exc:
        raise ToolDefinitionError(
            f"tool {name!r}: an argument annotation cannot be resolved ({exc})", tool=name
        ) from None
    adapters: dict[str, TypeAdapter[Any]] = {}
    for param in signature.parameters.values():
        hint = hints.get(param.name)
        if param.name == KEY or hint is None or hint is Any:
            continue
        try:
            adapters[param.name] = TypeAdapter(hint)
        except Exception:
            continue  # a type pydantic cannot build: the value is passed as it is

    def coerce(args: dict[str, Any]) -> dict[str, Any]:
        out = dict(args)
        for arg, adapter in adapters.items():
            if arg in out:
                # Recorded arguments are JSON: give a re-drive the types the function declares.
                out[arg] = adapter.validate_python(out[arg])
        return out

    return coerce
