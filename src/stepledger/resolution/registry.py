"""The tool registry recovery loads: tools by name, found by import path or entry point.

``--tools package.module:attr`` names a :class:`ToolRegistry`, a zero-argument callable
returning one (so a module does no work at import time), or an iterable of tools.  Installed
packages can also publish registries under the ``stepledger.tools`` entry-point group.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from stepledger import wire
from stepledger.domain.tools import Tool
from stepledger.errors import ToolRegistryError


class ToolRegistry:
    """Tools by name; a name is registered once."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> Tool:
        """Add a tool; a second, different tool under the same name is refused."""
        known = self._tools.get(tool.name)
        if known is not None and known is not tool:
            raise ToolRegistryError(f"tool {tool.name!r} is registered twice", tool=tool.name)
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        """The tool of that name, or None."""
        return self._tools.get(name)

    def require(self, name: str) -> Tool:
        """The tool of that name; a ToolRegistryError if it is not registered."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ToolRegistryError(f"no tool {name!r} is registered (known: {known})", tool=name)
        return tool

    def merge(self, other: ToolRegistry) -> ToolRegistry:
        """Register every tool of another registry into this one and return this one."""
        for tool in other:
            self.register(tool)
        return self

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


def load_registry(spec: str) -> ToolRegistry:
    """Load a registry from ``package.module:attr`` (a registry, a factory or tools)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ToolRegistryError(f"expected --tools package.module:attr, got {spec!r}")
    try:
        module = _import_from_here_too(module_name)
    except ImportError as exc:
        raise ToolRegistryError(f"cannot import {module_name!r}: {exc}") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ToolRegistryError(f"module {module_name!r} has no attribute {attr!r}") from None
    return _as_registry(target, spec)


def _import_from_here_too(module_name: str) -> ModuleType:
    """Import a module, also from the current directory (as ``python -m`` would).

    The ``stepledger`` console script does not put the current directory on the import path,
    so ``--tools mytools:registry`` beside the caller would not import without this.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if exc.name is None or not module_name.startswith(exc.name) or here in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def load_entry_point_registries() -> ToolRegistry:
    """Merge every registry published under the ``stepledger.tools`` entry-point group."""
    merged = ToolRegistry()
    for point in entry_points(group=wire.TOOLS_ENTRY_POINT_GROUP):
        try:
            target = point.load()
        except Exception as exc:  # a broken plugin must name itself, not crash anonymously
            raise ToolRegistryError(f"entry point {point.name!r} failed to load: {exc}") from exc
        merged.merge(_as_registry(target, point.value))
    return merged


def load_registries(specs: Iterable[str], *, entry_points_too: bool = True) -> ToolRegistry:
    """Merge the registries named by import paths, plus installed entry points if asked."""
    merged = load_entry_point_registries() if entry_points_too else ToolRegistry()
    for spec in specs:
        merged.merge(load_registry(spec))
    return merged


def _as_registry(target: Any, origin: str) -> ToolRegistry:
    if isinstance(target, ToolRegistry):
        return target
    if isinstance(target, Tool):
        return ToolRegistry([target])
    if callable(target):
        try:
            built = target()
        except Exception as exc:  # the factory's own error, named with where it came from
            raise ToolRegistryError(f"building the registry {origin!r} failed: {exc}") from exc
        return _as_registry(built, origin)
    if isinstance(target, Iterable):
        tools = list(target)
        if all(isinstance(t, Tool) for t in tools):
            return ToolRegistry(tools)
    raise ToolRegistryError(f"{origin!r} is not a ToolRegistry, a factory of one, or tools")
