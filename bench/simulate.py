"""The deterministic simulator's long run: many seeds, seeds per second, what was found.

``python -m bench.simulate [--seeds 3000] [--first 1] [--all]`` runs the seeds of the
default profile (what main must pass; CI runs the first 250 of them on every push) and,
with ``--all``, of the full profile too (variants that reach defects still open), shrinks
every new failure and prints one line per failure plus the rate.  No broker: everything is
one process (``stepledger simulate``).  Slow tier: not part of ``python -m bench``'s default
set (``python -m bench --only simulate`` runs its quick form).  Exit status 1 on a new
violation.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter

from bench.common import Row
from stepledger_dev.simulate.explore import Failure, Report, explore
from stepledger_dev.simulate.plan import FULL, Profile


def _line(failure: Failure) -> str:
    violation = failure.outcome.violations[0]
    tag = "known open" if failure.known else "NEW"
    plan = failure.shrunk.plan if failure.shrunk else failure.outcome.plan
    return f"  seed {failure.seed} [{tag}] {violation.line()}\n    schedule: {plan.encode()}"


def measure(first: int, seeds: int, profile: Profile, label: str) -> tuple[Report, Row]:
    """Run the seeds of one profile; the report and its seeds-per-second row."""
    report = explore(first, seeds, profile, on_failure=lambda f: print(_line(f), flush=True))
    kinds = Counter(f.outcome.violations[0].invariant for f in report.failures)
    print(
        f"[simulate] {label}: {report.seeds} seeds in {report.seconds:.1f}s "
        f"({report.rate:.1f}/s); {len(report.new)} new, "
        f"{len(report.failures) - len(report.new)} known open; {dict(kinds)}",
        flush=True,
    )
    return report, Row("simulate", f"seeds/s ({label})", report.rate, None, "seeds/s")


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """``python -m bench`` entry: the default profile's rate (no broker used)."""
    logging.disable(logging.ERROR)
    _, row = measure(1, 100 if quick else 1000, Profile(), "default profile")
    return [row]


def main() -> None:
    """Run many seeds and report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3000)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--all", action="store_true", help="also the full profile")
    args = parser.parse_args()
    logging.disable(logging.ERROR)
    report, _ = measure(args.first, args.seeds, Profile(), "default profile")
    new = len(report.new)
    if args.all:
        full, _ = measure(args.first, args.seeds, FULL, "full profile")
        new += len(full.new)
    sys.exit(1 if new else 0)


if __name__ == "__main__":
    main()
