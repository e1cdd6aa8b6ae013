"""Test-only entry: ``python -m stepledger_dev.simulate [--defect NAME ...] [simulate options]``.

The ``stepledger simulate`` command plus the switch only tests need (a fixed defect's old
behaviour put back, :mod:`stepledger_dev.simulate.defects`), kept out of the shipped CLI.
"""

from __future__ import annotations

import copy

import click

from stepledger_dev.simulate.command import simulate
from stepledger_dev.simulate.defects import SWITCHES


def with_defects() -> click.Command:
    """``stepledger simulate`` with the test-only ``--defect`` option."""
    command = copy.deepcopy(simulate)
    click.option(
        "--defect",
        "defect",
        multiple=True,
        type=click.Choice(sorted(SWITCHES)),
        help="Put a fixed defect's old behaviour back (the simulator must find it).",
    )(command)
    return command


def main() -> None:
    """Run ``stepledger simulate`` with the test-only switches."""
    with_defects().main(prog_name="python -m stepledger_dev.simulate")


if __name__ == "__main__":
    main()
