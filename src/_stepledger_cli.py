"""The ``stepledger`` command's entry point, outside the package.

The console script imports this module first, and the package (its SDK, click, the
areas' registry) only inside :func:`main`: a Ctrl-C while those import is one line and
exit code 130, as it is once the command runs, instead of a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Import the command line, then run it."""
    try:
        from stepledger.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        raise SystemExit(130) from None
    run()
