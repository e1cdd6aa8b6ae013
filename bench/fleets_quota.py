"""Fleets on one secured cluster: a flooding fleet held to its quota, its neighbour's steps.

Fleet A's agent floods its step log as fast as one client can (``bench.flooder``, pinned to
one core with ``taskset`` so the row measures the broker's throttling, not two processes
fighting for two cores) while held to a produce quota; fleet B runs sequential steps through
the SDK. The row is B's step p99 with A flooding against B's solo p99 in the same run (target
<= 2x). A second row says what A achieved against its quota (information: the broker lets a
burst through before it throttles). The bench starts its own secured 1-node Apache Kafka,
whatever ``--engine`` says: quotas need principals.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import stepledger as sl
from bench.common import Row, cli, percentile
from stepledger.config import Settings, config_text, load_settings, write_private
from stepledger.fleets.quotas import Quota
from stepledger.kafka.provision import create_fleet, set_fleet_quota
from stepledger_dev.apache_kafka import KafkaBroker
from stepledger_dev.apache_kafka.secure import Security

#: Fleet A's produce quota, per broker: what a runaway fleet is held to.
QUOTA_BYTES_PER_S = 1024 * 1024
#: Sequential steps of fleet B per phase (full, quick), after WARM unmeasured ones.
STEPS = (2000, 150)
WARM = 50
#: Seconds the flooder runs before B is measured (A's burst is over, throttling holds).
FLOOD_WARMUP_S = (3.0, 1.5)


@sl.tool(keyed=True)
def act(i: int, *, idempotency_key: str) -> int:
    """Fleet B's tool: the work is the step log's."""
    return i


def step_latencies(settings: Settings, steps: int) -> list[float]:
    """Seconds per sequential step of one workflow (after WARM unmeasured steps)."""
    run = uuid.uuid4().hex[:6]
    with sl.Ledger(settings, tools=[act]) as ledger:
        warming = ledger.workflow(f"warm-{run}")
        for i in range(WARM):
            warming.step(f"s{i}", act, i=i)
        wf = ledger.workflow(f"seq-{run}")
        latencies = []
        for i in range(steps):
            began = time.perf_counter()
            wf.step(f"s{i}", act, i=i)
            latencies.append(time.perf_counter() - began)
    return latencies


def start_flooder(config: Path) -> subprocess.Popen[str]:
    """Fleet A's flooder on core 0 (``taskset``; unpinned where taskset is missing)."""
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    command = [*pin, sys.executable, "-m", "bench.flooder", str(config), "600"]
    root = Path(__file__).resolve().parents[1]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=root)


def flooded(
    out: Path, steady: Settings, steps: int, warmup: float
) -> tuple[list[float], dict[str, float]]:
    """Fleet B's step latencies while fleet A floods; what the flooder reported."""
    flooder = start_flooder(out / "flooding-agent.toml")
    try:
        time.sleep(warmup)  # a fixed warm-up, not a condition: A's burst passes first
        loaded = step_latencies(steady, steps)
    finally:
        flooder.send_signal(signal.SIGTERM)
        answer, _ = flooder.communicate(timeout=60)
    return loaded, json.loads(answer)


def run(quick: bool = False, bootstrap: str | None = None) -> list[Row]:
    """B's step p99 with A flooding against B's solo p99; A's rate against its quota."""
    steps, warmup = STEPS[quick], FLOOD_WARMUP_S[quick]
    with tempfile.TemporaryDirectory() as tmp, KafkaBroker(security=Security()) as kafka:
        out = Path(tmp)
        admin_file = config_text({"bootstrap": kafka.bootstrap}, kafka.client_settings)
        admin = load_settings(config_file=write_private(out / "admin.toml", admin_file), env={})
        create_fleet(admin, "flooding", out, quota=Quota(producer_byte_rate=QUOTA_BYTES_PER_S))
        create_fleet(admin, "steady", out)
        steady = load_settings(config_file=out / "steady-agent.toml", env={})
        solo = step_latencies(steady, steps)
        loaded, flood = flooded(out, steady, steps, warmup)
        # The same flood without a quota: what the quota spared fleet B (information).
        set_fleet_quota(admin, "flooding", Quota(None, None, None))
        unlimited, _ = flooded(out, steady, steps, warmup)
    rate = flood["acked_bytes"] / flood["seconds"]
    label = f"with fleet A flooding at its {QUOTA_BYTES_PER_S // 1024} KiB/s quota"
    return [
        Row("fleets-quota", f"fleet B sequential step p99 {label} (vs B solo)",
            percentile(loaded, 99) * 1e3, percentile(solo, 99) * 1e3, "ms", "<=2",
            higher_is_better=False),
        Row("fleets-quota", f"fleet B sequential step p50 {label} (vs B solo)",
            percentile(loaded, 50) * 1e3, percentile(solo, 50) * 1e3, "ms",
            higher_is_better=False),
        Row("fleets-quota", "fleet B sequential step p99 with fleet A flooding without a "
            "quota (vs B solo)", percentile(unlimited, 99) * 1e3, percentile(solo, 99) * 1e3,
            "ms", higher_is_better=False),
        Row("fleets-quota", f"fleet A acked bytes/s flooding (vs its quota; max throttle "
            f"{flood['max_throttle_s']:.1f} s)", rate, QUOTA_BYTES_PER_S, "B/s",
            higher_is_better=False),
    ]  # fmt: skip


if __name__ == "__main__":
    cli(run, __doc__)
