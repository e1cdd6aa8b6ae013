"""The ``stepledger`` command line: one click group; each area registers its commands."""

from __future__ import annotations

import sys

import click

from stepledger.cli._common import run_guarded
from stepledger.cli._demo import register as register_demo
from stepledger.cli._doctor import register as register_doctor
from stepledger.cli._inbox import register as register_inbox
from stepledger.cli._ledger import register as register_ledger
from stepledger.cli._projector import register as register_projector
from stepledger.cli._recovery import register as register_recovery
from stepledger.cli._runtime import register as register_runtime
from stepledger.dev.chaos.command import register as register_chaos


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="stepledger")
def cli() -> None:
    """stepledger: a durable step log that lets agent fleets survive crashes."""


for _register in (
    register_ledger,
    register_projector,
    register_recovery,
    register_runtime,
    register_demo,
    register_inbox,
    register_chaos,
    register_doctor,
):
    _register(cli)


def main() -> None:
    """Console entry point: user errors become one line and a non-zero exit, never a traceback."""
    sys.exit(run_guarded(cli))
