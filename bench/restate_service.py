"""The peer bench's Restate service: the same agent workload as a Restate Python SDK service.

``python -m bench.restate_service PORT WORKDIR [KILL_AT]`` serves it with Hypercorn on
``127.0.0.1:PORT`` (HTTP/2 cleartext, what the Restate server speaks to a deployment).
Service ``peer``, each step one ``ctx.run_typed`` of the same trivial tool (the step is
durable once the server acknowledged its journal entry):

- ``seq(n)``: n steps one after another; returns each step's latency (seconds);
- ``work(n)``: n steps; returns their sum;
- ``long(n)``: n steps whose tool appends one line per call to ``WORKDIR/effects-restate``
  and, at step KILL_AT, SIGKILLs the process after the effect and before the journal
  entry is written (the kill-and-resume row).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import restate

peer = restate.Service("peer")
WORKDIR = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
KILL_AT = int(sys.argv[3]) if len(sys.argv) > 3 else -1


async def act(i: int) -> int:
    """The bench's tool: the work is the system's own."""
    return i


def act_with_effect(i: int) -> int:
    """The tool of the kill-and-resume row: counts its effect, dies inside step KILL_AT."""
    with (WORKDIR / "effects-restate").open("a") as out:
        out.write(f"{i}\n")
    if i == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


@peer.handler()
async def seq(ctx: restate.Context, n: int) -> list[float]:
    """n steps one after another, each one's latency."""
    latencies = []
    for i in range(n):
        began = time.perf_counter()
        await ctx.run_typed(f"s{i}", act, restate.RunOptions(), i)
        latencies.append(time.perf_counter() - began)
    return latencies


@peer.handler()
async def work(ctx: restate.Context, n: int) -> int:
    """One agent's workflow: n steps."""
    total = 0
    for i in range(n):
        total += await ctx.run_typed(f"s{i}", act, restate.RunOptions(), i)
    return total


@peer.handler()
async def long(ctx: restate.Context, n: int) -> int:
    """The long workflow of the kill-and-resume row."""
    total = 0
    for i in range(n):
        total += await ctx.run_typed(f"s{i}", act_with_effect, restate.RunOptions(), i)
    return total


def main() -> None:
    """Serve the service on loopback until killed."""
    import hypercorn.asyncio
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    config.h2_max_concurrent_streams = 2**31 - 1
    config.keep_alive_timeout = 3600
    config.loglevel = "WARNING"
    config.accesslog = None
    print("serving", flush=True)
    asyncio.run(hypercorn.asyncio.serve(restate.app(services=[peer]), config))


if __name__ == "__main__":
    main()
