"""Run every benchmark and print one summary table of ratios: ``python -m bench [--quick]``.

``--engine kafka`` starts one 1-node Apache Kafka for the run and gives every bench its
bootstrap; the default (``tansu``) lets each bench start its own Tansu broker.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from bench.common import ENGINES, Row, machine, run_broker, table

BENCHES = (
    "producer",
    "concurrency",
    "projector",
    "recovery",
    "resume",
    "open",
    "opens",
    "inbox",
    "scale",
    "peers",
    "checkpoint",
    "sdk_cpu",
    "model_turns",
    "fleet",
    "fleets_quota",
    "lake",
)


def main() -> None:
    """Run the selected benches (all by default) and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument("--bootstrap", help="use this broker instead of a local one per bench")
    parser.add_argument(
        "--engine", choices=ENGINES, default="tansu", help="the local broker (default: tansu)"
    )
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHES)}")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(BENCHES)
    rows: list[Row] = []
    started = time.time()
    with run_broker(args.engine, args.bootstrap) as bootstrap:
        for name in names:
            module = importlib.import_module(f"bench.{name}")
            bench_started = time.perf_counter()
            rows.extend(module.run(quick=args.quick, bootstrap=bootstrap))
            print(f"[{name}] done in {time.perf_counter() - bench_started:.0f}s", flush=True)
    broker = args.bootstrap or args.engine
    print(
        f"\nmachine: {machine()}; broker: {broker}; quick={args.quick}; "
        f"{time.time() - started:.0f}s in all\n"
    )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2))


if __name__ == "__main__":
    main()
