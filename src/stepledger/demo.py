"""The demo: a local broker, an example workflow recorded step by step, its log read back."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from stepledger.broker import LocalBroker
from stepledger.codec import Codec
from stepledger.config import Settings
from stepledger.consume import read_topic
from stepledger.domain.tools import Tool
from stepledger.kafka import ensure_topics
from stepledger.producer import Ledger

Echo = Callable[[str], None]

LOOKUP = Tool(name="lookup_customer", effect="read_only")
CHARGE = Tool(name="charge_card", effect="idempotent", keyed=True, secret_args=frozenset({"card"}))


@contextlib.contextmanager
def _broker(external: str | None, echo: Echo) -> Iterator[str]:
    if external:
        yield external
        return
    with tempfile.TemporaryDirectory(prefix="stepledger-demo-") as tmp:
        broker = LocalBroker(log_path=None)
        with broker:
            echo(f"local broker (Tansu) on {broker.bootstrap}; logs in {tmp}")
            yield broker.bootstrap


def run_demo(settings: Settings, *, external_bootstrap: str | None, echo: Echo) -> None:
    """Record one example workflow durably and print its events back from the topic."""
    with _broker(external_bootstrap, echo) as bootstrap:
        settings = settings.model_copy(update={"bootstrap": bootstrap, "fleet_id": "demo"})
        ensure_topics(settings, [settings.topic, settings.dlq_topic])
        with Ledger(settings) as ledger:
            wf = ledger.start("demo-order-1", name="checkout")
            customer = wf.step("lookup", LOOKUP, {"email": "ada@example.com"}, fn=_lookup)
            wf.step("charge", CHARGE, {"amount": 1250, "card": "4242424242424242"}, fn=_charge)
            echo(f"recorded workflow demo-order-1 for {customer['name']}")
        echo("the step log, read back from Kafka:")
        for record in read_topic(settings, Codec(), idle_timeout=0.3):
            if record.event is not None:
                e = record.event
                echo(f"  {e.occurred_at:%H:%M:%S.%f} {e.step_id or '-':8} {e.type}")


def _lookup(args: dict[str, Any], key: str) -> dict[str, Any]:
    return {"name": "Ada", "email": args["email"]}


def _charge(args: dict[str, Any], key: str) -> dict[str, Any]:
    return {"charge_id": "ch_" + key[-8:], "amount": args["amount"]}
