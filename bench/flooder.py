"""One fleet's runaway client: produce to its step log as fast as the broker takes records.

``python -m bench.flooder CONFIG SECONDS`` (a role's config file from ``fleet create``)
floods the config's step log with 1 KB records for SECONDS (or until SIGTERM), then prints
one JSON line: the
bytes acknowledged while it flooded, the seconds it flooded, and the throttle time the broker
reported (the ``throttle_time_ms`` of its answers, as librdkafka's ``throttle_cb`` hands it
over).  Undelivered records at the end are abandoned: the flood's rate is what was acked.
The quota bench pins it to one core (``taskset``) and the quota test runs it beside a fleet
that must not notice it.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer

from stepledger.config import load_settings

RECORD = b"x" * 1000


def flood(config: Path, seconds: float) -> dict[str, float]:
    """Flood the step log of ``config`` for ``seconds``; what was acked and throttled."""
    settings = load_settings(config_file=config, env={})
    acked, throttled = [0], [0.0]

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked[0] += len(msg.value() or b"")

    def throttle(event: object) -> None:
        throttled[0] = max(throttled[0], float(event.throttle_time))  # type: ignore[attr-defined]

    producer = Producer(
        settings.client_config(
            **{"linger.ms": 5, "acks": "all", "throttle_cb": throttle, "log_level": 0}
        )
    )
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda number, _frame: stopped.append(number))
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds and not stopped:
        try:
            producer.produce(settings.topic, RECORD, str(sent).encode(), on_delivery=delivered)
            sent += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.purge()
    producer.flush(1)
    return {"acked_bytes": acked[0], "seconds": elapsed, "max_throttle_s": throttled[0]}


if __name__ == "__main__":
    print(json.dumps(flood(Path(sys.argv[1]), float(sys.argv[2]))), flush=True)
