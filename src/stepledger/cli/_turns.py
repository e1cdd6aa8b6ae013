"""One line per step for a person: a model turn as its model, the calls it asked for and a
preview of what it said, any other step cut to a line (``--full`` prints the recorded blob).

A recorded model turn is the framework's serialized response (Pydantic AI's messages, the
OpenAI Agents SDK's output items, LangChain's message): a thousand characters of JSON that
bury the two things a person looks for.  The shapes differ per framework, so the summary
reads keys they share (``model_name``/``model``, ``content``/``text``, a tool call's
``name`` or ``tool_name``) wherever they sit, within a bounded walk.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from stepledger.domain.context import StepSummary, render
from stepledger.wire import MODEL_STEP_TOOL

LINE = 160
"""How long a step's line may grow before it is cut (``--full`` prints it whole)."""
PREVIEW = 60
"""How much of a model turn's text its summary shows."""
_MAX_NODES = 2_000  # a pathological result costs a bounded walk, not a hang


def step_line(step: StepSummary, *, full: bool = False) -> str:
    """The step as one line: whole with ``full``, else summarised or cut to :data:`LINE`."""
    whole = render([step])
    if full:
        return whole
    if step.tool == MODEL_STEP_TOOL and step.result is not None:
        return f"{step.step_id} [{step.tool}] {step.status.value} {turn_summary(step.result)}"
    if len(whole) <= LINE:
        return whole
    return f"{whole[: LINE - 1]}… ({len(whole):,} chars; --full prints it whole)"


def turn_summary(result: Any) -> str:
    """A recorded model turn in a few words: model, tool calls asked for, text preview, size."""
    model, calls, texts = None, [], []
    for key, value, parent in _walk(result):
        if key in ("model_name", "model") and isinstance(value, str) and model is None:
            model = value
        elif key in ("tool_name", "name") and isinstance(value, str) and _is_call(parent):
            calls.append(value)
        elif key in ("content", "text") and isinstance(value, str) and value.strip():
            texts.append(" ".join(value.split()))
    parts = [f"model={model or '?'}"]
    if calls:
        parts.append("calls=" + ",".join(dict.fromkeys(calls)))
    if texts:
        text = texts[0]
        parts.append(json.dumps(text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"))
    size = len(json.dumps(result, default=str))
    parts.append(f"({size:,} chars; --full prints it whole)")
    return " ".join(parts)


def _is_call(node: dict[str, Any]) -> bool:
    # A tool call names its tool beside its arguments; a message's "name" is its author.
    return any(k in node for k in ("args", "arguments", "tool_call_id")) or (
        node.get("type") == "function_call"
    )


def _walk(value: Any) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """Every (key, value, owning object) of a JSON value, breadth first, bounded."""
    queue, seen = [value], 0
    while queue and seen < _MAX_NODES:
        node = queue.pop(0)
        seen += 1
        if isinstance(node, dict):
            for key, item in node.items():
                yield str(key), item, node
                queue.append(item)
        elif isinstance(node, list):
            queue.extend(node)
