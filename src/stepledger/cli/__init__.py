"""The ``stepledger`` command line: one click group; each area registers its commands.

An area's module is imported only when one of its commands runs (or help lists it), so a
bare SDK install (no ``[projector]``, ``[inbox]`` or ``[local]`` extra) still has a working
``stepledger`` command: a command whose extra is missing says which one in one line.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import click

from stepledger.cli._common import run_guarded

#: Each area's module, the extra it needs, and the commands its ``register`` adds.
AREAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "stepledger.cli._ledger": ("", ("broker", "init", "append", "tail")),
    "stepledger.cli._projector": ("projector", ("project", "rebuild")),
    "stepledger.cli._query": ("projector", ("query", "status")),
    "stepledger.cli._dlq": ("projector", ("dlq",)),
    "stepledger.cli._recovery": (
        "recovery",
        ("recover", "recover-health", "escalations", "reconcile"),
    ),
    "stepledger.cli._runtime": ("", ("approve", "deny", "approvals", "workflows")),
    "stepledger.cli._checkpoints": ("", ("checkpoint",)),
    "stepledger.cli._demo": ("local", ("demo",)),
    "stepledger.cli._inbox": ("inbox", ("inbox", "inbox-user")),
    "stepledger.dev.chaos.command": ("local", ("chaos",)),
    "stepledger.dev.simulate.command": ("local", ("simulate",)),
    "stepledger.cli._doctor": ("", ("doctor",)),
}


def _area_of(name: str) -> str | None:
    return next((module for module, (_, names) in AREAS.items() if name in names), None)


class LazyGroup(click.Group):
    """A group that imports an area's module when one of its commands is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for _, names in AREAS.values() for name in names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _area_of(cmd_name)
        if module is None:
            return None
        try:
            return area_commands(module)[cmd_name]
        except ModuleNotFoundError as exc:
            return _needs_extra(cmd_name, AREAS[module][0], (exc.name or "?").split(".")[0])


def area_commands(module: str) -> dict[str, click.Command]:
    """The commands an area's module registers, by name."""
    collected = click.Group()
    register: Callable[[click.Group], None] = importlib.import_module(module).register
    register(collected)
    return dict(collected.commands)


def _needs_extra(name: str, extra: str, missing: str) -> click.Command:
    install = f"pip install 'stepledger[{extra}]'" if extra else "pip install stepledger"
    message = f"`stepledger {name}` needs {missing!r}, which is not installed: {install}"

    @click.command(name, context_settings={"ignore_unknown_options": True}, help=message)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def unavailable(args: tuple[str, ...]) -> None:
        raise click.ClickException(message)

    return unavailable


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stepledger")
def cli() -> None:
    """stepledger: a durable step log that lets agent fleets survive crashes."""


def main() -> None:
    """Console entry point: user errors become one line and a non-zero exit, never a traceback."""
    sys.exit(run_guarded(cli))
