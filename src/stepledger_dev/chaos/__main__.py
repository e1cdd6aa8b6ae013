"""Test-only entry: ``python -m stepledger_dev.chaos [--break MODE] [chaos options]``.

The ``stepledger chaos`` command plus the switches only tests need (a deliberately broken
build the harness must catch), kept out of the shipped CLI.
"""

from __future__ import annotations

import copy

import click

from stepledger_dev.chaos.command import chaos

#: ``redrive-ignores-key``: a payments tool whose re-drive ignores the key; ``shared-state``
#: (with ``--two-deployments``): the second deployment gets the first one's state topics.
BREAK_MODES = ("redrive-ignores-key", "shared-state")


def main() -> None:
    """Run ``stepledger chaos`` with the test-only switches."""
    command = copy.deepcopy(chaos)
    click.option(
        "--break",
        "break_mode",
        type=click.Choice(BREAK_MODES),
        help="Run a deliberately broken build that the harness must catch.",
    )(command)
    command.main(prog_name="python -m stepledger_dev.chaos")


if __name__ == "__main__":
    main()
