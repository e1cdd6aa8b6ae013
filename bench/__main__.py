"""Run every benchmark and print one summary table of ratios: ``python -m bench [--quick]``."""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from bench.common import Row, machine, table

BENCHES = ("producer", "projector", "recovery", "resume", "inbox")


def main() -> None:
    """Run the selected benches (all by default) and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument("--bootstrap", help="use this broker instead of a local one per bench")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHES)}")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(BENCHES)
    rows: list[Row] = []
    started = time.time()
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        bench_started = time.perf_counter()
        rows.extend(module.run(quick=args.quick, bootstrap=args.bootstrap))
        print(f"[{name}] done in {time.perf_counter() - bench_started:.0f}s", flush=True)
    print(f"\nmachine: {machine()}; quick={args.quick}; {time.time() - started:.0f}s in all\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2))


if __name__ == "__main__":
    main()
