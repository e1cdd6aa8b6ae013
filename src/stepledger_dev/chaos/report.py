"""The chaos report: a table of crash point x count x violations, and a JSON file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from stepledger_dev.chaos.harness import RunResult
from stepledger_dev.chaos.plan import CrashPoint


def rows(result: RunResult) -> list[tuple[str, int, int]]:
    """(crash point, times exercised, violations attributed to it), in a stable order."""
    label = {w.workflow_id: w.label.value for w in result.plan.workflows}
    counts = Counter(label.values())
    counts.update(result.infra_done)
    bad = Counter(label.get(v.workflow_id or "", "global") for v in result.violations)
    order = [p.value for p in CrashPoint] + ["global"]
    return [(p, counts.get(p, 0), bad.get(p, 0)) for p in order if counts.get(p) or bad.get(p)]


def table(result: RunResult) -> str:
    """The human table."""
    lines = [f"{'crash point':32} {'count':>6} {'violations':>10}"]
    lines += [f"{p:32} {n:>6} {v:>10}" for p, n, v in rows(result)]
    return "\n".join(lines)


def as_json(result: RunResult, options: dict[str, Any]) -> dict[str, Any]:
    """The JSON report."""
    return {
        "seed": result.plan.seed,
        "topic": result.topic,
        "options": options,
        "passed": not result.violations,
        "seconds": round(result.seconds, 1),
        "events": result.events,
        "workflow_status": dict(Counter(result.status.values())),
        "broker_faults": result.broker_faults,
        "acked_in_broker_faults": result.acked_in_broker_faults,
        "members": result.members,
        "replays_from_zero": result.replays_from_zero,
        "decided_by_daemons": result.decided_by_daemons,
        "projector_replays_by_member": result.projector_replays_by_member,
        "lake_offsets": result.lake_offsets,
        "analyst_cuts": result.analyst_cuts,
        "crash_points": [{"point": p, "count": n, "violations": v} for p, n, v in rows(result)],
        "violations": [
            {"invariant": v.invariant, "workflow_id": v.workflow_id, "detail": v.detail}
            for v in result.violations
        ],
        "replay": f"stepledger chaos --workflows {len(result.plan.workflows)} "
        f"--seed {result.plan.seed}" + _members(options),
    }


def _members(options: dict[str, Any]) -> str:
    flags = [
        f" --{name} {options[name]}"
        for name in ("projectors", "recoverers")
        if str(options.get(name, "1")) != "1"
    ]
    if str(options.get("no_shared_state")) == "True":
        flags.append(" --no-shared-state")
    return "".join(flags)


def write(path: Path, report: dict[str, Any]) -> None:
    """Write the JSON report."""
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
