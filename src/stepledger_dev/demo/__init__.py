"""``stepledger demo``: a local stack, an agent SIGKILLed mid-step, recovery, the evidence."""

from __future__ import annotations

from stepledger_dev.demo.run import DemoOptions, DemoResult, run_demo

__all__ = ["DemoOptions", "DemoResult", "run_demo"]
