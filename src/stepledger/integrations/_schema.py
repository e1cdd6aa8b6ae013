"""A tool's arguments as the model sees them: a JSON schema without ``idempotency_key``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel, create_model

from stepledger.domain.decorator import KEY
from stepledger.domain.tools import Tool
from stepledger.errors import ToolDefinitionError


def model_name(tool: Tool | str) -> str:
    """A tool's name as a model may see it (letters, digits, ``_`` and ``-``)."""
    name = tool if isinstance(tool, str) else tool.name
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)


def tool_function(tool: Tool) -> Callable[..., Any] | None:
    """The plain function a decorated tool was made of, or None for a ``Tool`` spec."""
    private = tool.__pydantic_private__ or {}
    return cast("Callable[..., Any] | None", private.get("_function"))


def arguments_model(tool: Tool) -> type[BaseModel] | None:
    """A pydantic model of a decorated tool's arguments (without the key), or None."""
    fn = tool_function(tool)
    if fn is None:
        return None
    fields: dict[str, Any] = {}
    hints = inspect.get_annotations(fn, eval_str=True)
    for name, param in inspect.signature(fn).parameters.items():
        if name == KEY or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    return cast(type[BaseModel], create_model(f"{model_name(tool)}_args", **fields))


def parameters_schema(tool: Tool, parameters: type[BaseModel] | None = None) -> dict[str, Any]:
    """The JSON schema of a tool's arguments, without ``idempotency_key``."""
    model = parameters or arguments_model(tool)
    if model is None:
        raise ToolDefinitionError(
            f"tool {tool.name!r} was not made from a function: pass parameters= (a pydantic "
            "model of its arguments)",
            tool=tool.name,
        )
    schema = model.model_json_schema()
    schema.get("properties", {}).pop(KEY, None)
    if KEY in schema.get("required", []):
        schema["required"].remove(KEY)
    schema.setdefault("additionalProperties", False)
    return schema
