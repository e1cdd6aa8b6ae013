"""The ``stepledger`` command line: one click group; each area registers its commands.

An area's module is imported only when one of its commands runs (or help lists it), so a
bare SDK install (no ``[projector]``, ``[inbox]`` or ``[local]`` extra) still has a working
``stepledger`` command: a command whose extra is missing says which one in one line, whether
the missing library is found when its module is imported or later, when the command runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable

import click

from stepledger.cli._common import run_guarded

#: The development tools' package: it ships with a checkout of the repository, never in the
#: wheel (``pip install -e '.[local]'`` in the checkout brings it and its libraries).
DEV_TOOLS = "stepledger_dev"
#: The extra that brings the development tools' libraries (their commands need both).
DEV_EXTRA = "local"

#: Each area's module, the extra it needs (``""`` for none) and the commands its
#: ``register`` adds. The one place that says which command needs what.
AREAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "stepledger.cli._ledger": ("", ("init", "append", "tail")),
    "stepledger.cli._broker": ("local", ("broker",)),
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
    "stepledger_dev.chaos.command": ("local", ("chaos",)),
    "stepledger_dev.simulate.command": ("local", ("simulate",)),
    "stepledger.cli._doctor": ("", ("doctor",)),
    "stepledger.cli._fleet": ("", ("fleet",)),
    "stepledger.cli._budget": ("", ("budget",)),
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
            return _needs_extra(cmd_name, AREAS[module][0], _top(exc))

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; a library it imports as it runs, missing, is one line too."""
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            # A module of stepledger itself missing is a broken install, not a missing extra.
            module = _area_of(ctx.invoked_subcommand or "")
            if module is None or _top(exc) in ("stepledger", "?"):
                raise
            name = ctx.invoked_subcommand or "?"
            raise click.ClickException(needs_message(name, AREAS[module][0], _top(exc))) from None


def _top(exc: ModuleNotFoundError) -> str:
    return (exc.name or "?").split(".")[0]


def area_commands(module: str) -> dict[str, click.Command]:
    """The commands an area's module registers, by name."""
    collected = click.Group()
    register: Callable[[click.Group], None] = importlib.import_module(module).register
    register(collected)
    return dict(collected.commands)


def needs_message(name: str, needs: str, missing: str) -> str:
    """The one line for a command whose library is missing: what to install, or where it runs."""
    if needs == DEV_EXTRA and importlib.util.find_spec(DEV_TOOLS) is None:
        missing = DEV_TOOLS  # no extra brings them: say so first, not after the extra
    if missing == DEV_TOOLS:
        install = "it runs from a checkout of the repository (pip install -e '.[local]' there)"
    else:
        install = f"pip install 'stepledger[{needs}]'" if needs else "pip install stepledger"
    return f"`stepledger {name}` needs {missing!r}, which is not installed: {install}"


def _needs_extra(name: str, needs: str, missing: str) -> click.Command:
    message = needs_message(name, needs, missing)

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
