"""A bounded soak: agents stream workflows while the daemons are killed, for N minutes.

``python -m bench.soak --minutes 10`` runs the local stack (broker, example services, the
projector and the recovery daemon), waves of trip agents (the chaos plan: crashes at every
point, crash loops, resume races), and SIGKILLs the projector and the recovery daemon in
turn every ``--kill-every`` seconds (a supervisor restarts them).  Every 5 s it samples each
long-lived process's resident memory.  At the end it settles, checks every chaos invariant
(no acknowledged event lost, effects exactly once or compensated, projection == rebuild) and
prints RSS per process per minute.  Bounded: ``--minutes`` plus at most a few minutes to
settle.  Not part of ``python -m bench`` (it takes minutes by design).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepledger_dev.chaos.harness import TERMINAL, ChaosOptions, Run
from stepledger_dev.chaos.invariants import check_all
from stepledger_dev.chaos.plan import make_plan
from stepledger_dev.stack import LocalStack, StackOptions


@dataclass
class Samples:
    """RSS samples (MiB) per process name, with the seconds since the start."""

    started: float = field(default_factory=time.monotonic)
    rows: list[tuple[float, str, float]] = field(default_factory=list)

    def take(self, name: str, pid: int | None) -> None:
        """Read one process's VmRSS from /proc (nothing if it is gone)."""
        if pid is None:
            return
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
                self.rows.append((time.monotonic() - self.started, name, rss))
                return

    def per_minute(self) -> dict[str, list[float]]:
        """The highest RSS each process reached in each minute."""
        found: dict[str, dict[int, float]] = {}
        for at, name, rss in self.rows:
            minute = int(at // 60)
            minutes = found.setdefault(name, {})
            minutes[minute] = max(rss, minutes.get(minute, 0.0))
        return {name: [mins[m] for m in sorted(mins)] for name, mins in found.items()}


def main() -> None:
    """Run the soak and print its report (and write it as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--kill-every", type=float, default=60.0)
    parser.add_argument("--wave", type=int, default=40, help="workflows per wave")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = soak(args.minutes * 60, args.kill_every, args.wave, args.seed)
    print(json.dumps(report["summary"], indent=2))
    for name, mibs in report["rss_mib_per_minute"].items():
        print(f"{name:10s} " + " ".join(f"{m:6.1f}" for m in mibs))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def soak(seconds: float, kill_every: float, wave: int, seed: int) -> dict[str, Any]:
    """Run the soak; return its summary and the RSS samples per minute."""
    options = ChaosOptions(workflows=wave, seed=seed, duration_s=seconds + 600)
    stack_options = StackOptions(topic_prefix=f"soak-{seed}", fleet_id="soak")
    with (
        tempfile.TemporaryDirectory(prefix="stepledger-soak-") as tmp,
        LocalStack(Path(tmp), stack_options) as stack,
    ):
        run = Run(options, stack)
        stack.start_daemons()
        samples, stop = Samples(), threading.Event()
        sampler = threading.Thread(target=_sample, args=(run, samples, stop), daemon=True)
        sampler.start()
        waves, kills = 0, 0
        status: dict[str, str] = {}
        began = last_kill = time.monotonic()
        while time.monotonic() - began < seconds:
            plan = make_plan(
                wave, seed * 1000 + waves, steps=4, max_attempts=3, broker_restarts=False
            )
            for round_no in range(max(len(w.kills) for w in plan.workflows) + 2):
                targets = [
                    (w.workflow_id, w.kills[round_no] if round_no < len(w.kills) else None)
                    for w in plan.workflows
                    if status.get(w.workflow_id) not in TERMINAL
                ]
                if not targets:
                    break
                status.update(run.run_round(round_no, targets, []))
                if time.monotonic() - last_kill >= kill_every:
                    name = ("projector", "recovery")[kills % 2]
                    run.procs[name].kill()
                    run.procs[name].start()
                    kills, last_kill = kills + 1, time.monotonic()
            waves += 1
        run.settle(timeout=180.0)
        run.stop_projector_caught_up(timeout=120.0)
        stop.set()
        sampler.join(10)
        found = run.evidence()
        violations = check_all(found)
    summary = {
        "minutes": round(seconds / 60, 1),
        "waves": waves,
        "workflows": len(status),
        "events": len(found.events),
        "daemon_kills": kills,
        "violations": [f"{v.invariant}: {v.detail}" for v in violations],
    }
    return {"summary": summary, "rss_mib_per_minute": samples.per_minute()}


def _sample(run: Run, samples: Samples, stop: threading.Event) -> None:
    while not stop.wait(5.0):
        for name in ("projector", "recovery"):
            process = run.procs[name].process
            samples.take(name, None if process is None else process.pid)
        broker = run.stack.broker
        samples.take(
            "broker", None if broker is None or broker.process is None else broker.process.pid
        )


if __name__ == "__main__":
    main()
