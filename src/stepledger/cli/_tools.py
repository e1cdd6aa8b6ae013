"""The ``--tools`` option of recovery's commands: which tool registries to load, or none.

A recovery daemon with no registry is a legitimate, safe choice: every step left in doubt
names a tool it does not know, and the pure decision (``domain.resolution.decide``) gives
such a step to people (``EscalationKind.NO_TOOL``) once its deadline and grace have passed.
It must be chosen, though (``--tools none``): a registry that is merely missing, a typo in
an environment or an image without the package, would otherwise send every step to the
human queue without anyone having meant it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from stepledger.errors import ConfigError
from stepledger.resolution.registry import ToolRegistry, load_registries

#: ``--tools none`` / ``STEPLEDGER_TOOLS=none``: load no registry, not even entry points.
NO_TOOLS = "none"

#: The one line a daemon started with ``--tools none`` logs at start.
NO_TOOLS_NOTICE = (
    "no tool registry (--tools none): every step left in doubt goes to the human queue "
    "(stepledger escalations list) after its deadline and grace"
)


def tools_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--tools`` (repeatable, or ``none``) and ``--no-entry-points`` to a command."""
    fn = click.option(
        "--no-entry-points", is_flag=True, help="Ignore registries installed as entry points."
    )(fn)
    return click.option(
        "--tools",
        "tool_specs",
        multiple=True,
        envvar="STEPLEDGER_TOOLS",
        metavar="MODULE:ATTR",
        help="Tool registry to load (repeatable), e.g. stepledger_dev.examples.tools:registry; "
        f"'{NO_TOOLS}': no registry at all, every step left in doubt goes to people.",
    )(fn)


def load_tools(tool_specs: tuple[str, ...], no_entry_points: bool) -> ToolRegistry:
    """The registries named (plus entry points), an empty one for ``none``, else one line."""
    if NO_TOOLS in tool_specs:
        if len(tool_specs) > 1:
            raise ConfigError(
                f"--tools {NO_TOOLS} loads no registry: give it alone, or only MODULE:ATTR"
            )
        return ToolRegistry()
    tools = load_registries(tool_specs, entry_points_too=not no_entry_points)
    if not len(tools):
        raise ConfigError(
            "no tools: pass --tools MODULE:ATTR (or install an entry point), or "
            f"--tools {NO_TOOLS} to send every step left in doubt to the human queue"
        )
    return tools
