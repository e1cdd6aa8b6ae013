"""One process of the trace test: an agent that crashes, the recovery daemon, the resume.

Each process exports every span it ends, at once, as a JSON line to the file it is given
(``SimpleSpanProcessor``): a process SIGKILLed later has written what it finished.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from stepledger.config import Settings
from stepledger.domain.tools import Found, Tool
from stepledger.producer import Ledger
from stepledger.resolution.registry import ToolRegistry

WORKFLOW = "wf-traced"
FETCH = Tool(name="fetch", read_only=True)
#: Recovery's query finds the effect, so its decision is an outcome in the log.
BOOK = Tool(
    name="book",
    effect="idempotent",
    keyed=True,
    policy="query",
    timeout_s=1.0,
    query=lambda args, key: Found({"booking": key}),
)
NOTIFY = Tool(name="notify", effect="idempotent", keyed=True)
registry = ToolRegistry([FETCH, BOOK, NOTIFY])


def export_to(path: str) -> None:
    """Export each span as one JSON line to ``path`` as soon as it ends."""
    out: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the process

    def line(span: ReadableSpan) -> str:
        return str(span.to_json(indent=None)) + "\n"

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=line)))
    trace.set_tracer_provider(provider)


def _die(args: dict[str, Any], key: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    mode, spans = argv[0], argv[1]
    export_to(spans)
    if mode == "recover":
        from stepledger.cli import main as cli_main

        sys.argv = ["stepledger", "recover", *argv[2:]]
        cli_main()
        return
    bootstrap, topic = argv[2], argv[3]
    settings = Settings(bootstrap=bootstrap, topic=topic, fleet_id="otel", producer_id=mode)
    ledger = Ledger(settings, tools=registry)
    wf = ledger.workflow(WORKFLOW)
    wf.step("fetch", FETCH, {"q": 1}, lambda a, k: {"page": 1})
    if mode == "crash":
        wf.step("book", BOOK, {"room": 7}, _die)
    wf.step("book", BOOK, {"room": 7}, lambda a, k: {"unexpected": "second call"})
    wf.step("notify", NOTIFY, {"to": "x"}, lambda a, k: {"sent": True})
    wf.finish()
    ledger.close()


if __name__ == "__main__":
    main(sys.argv[1:])
