"""One agent process of the peer bench's kill-and-resume: the same workflow on either system.

``python -m bench.peer_agent SYSTEM MODE WORKDIR STEPS [KILL_AT] [BOOTSTRAP TOPIC | URL]``

- SYSTEM: ``stepledger`` (``import stepledger as sl``: ``@sl.tool``, ``ledger.workflow``,
  ``wf.step``), ``dbos`` (``@DBOS.workflow``/``@DBOS.step``, SQLite system database in
  WORKDIR, DBOS's defaults) or ``dbos-postgres`` (the same on the PostgreSQL system
  database at URL).
- MODE: ``die`` runs the workflow and SIGKILLs itself inside step KILL_AT, after the tool's
  effect and before anything recorded it (the worst point for both); ``resume`` starts
  again and runs the same workflow to its end (stepledger: ``ledger.workflow`` resumes it;
  DBOS: ``DBOS.launch()`` recovers it).

The tool appends one line per call to ``WORKDIR/effects-SYSTEM`` (the effects it counts);
stepledger's query hook looks the idempotency key up there.  The last line printed is
``done SECONDS`` (from the process start to the workflow's end).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
WORKFLOW_ID = "peer-kill-resume"


def effects(workdir: Path, system: str) -> Path:
    """The file each tool call appends its effect to."""
    return workdir / f"effects-{system}"


def _effect(path: Path, line: str, die: bool) -> None:
    with path.open("a") as out:
        out.write(line + "\n")
    if die:
        os.kill(os.getpid(), signal.SIGKILL)


def run_stepledger(mode: str, workdir: Path, steps: int, kill_at: int, where: list[str]) -> None:
    """The workflow through stepledger's front door."""
    import stepledger as sl

    path = effects(workdir, "stepledger")

    def find(args: dict[str, Any], idempotency_key: str) -> sl.Found | sl.NotFound:
        lines = path.read_text().splitlines() if path.exists() else []
        found = any(line.endswith(" " + idempotency_key) for line in lines)
        return sl.Found(args["i"]) if found else sl.NotFound()

    @sl.tool(keyed=True, policy="query", query=find)
    def act(i: int, *, idempotency_key: str) -> int:
        _effect(path, f"{i} {idempotency_key}", mode == "die" and i == kill_at)
        return i

    bootstrap, topic = where
    settings = sl.Settings(bootstrap=bootstrap, topic=topic, producer_id=f"peer-{mode}")
    with sl.Ledger(settings, tools=[act]) as ledger:
        wf = ledger.workflow(WORKFLOW_ID)
        for i in range(steps):
            wf.step(f"s{i}", act, i=i)
        wf.finish()


def run_dbos(system: str, mode: str, workdir: Path, steps: int, kill_at: int, url: str) -> None:
    """The workflow through DBOS Transact on the system database at ``url``, its defaults."""
    from dbos import DBOS, SetWorkflowID

    path = effects(workdir, system)

    @DBOS.step()
    def act(i: int) -> int:
        _effect(path, str(i), mode == "die" and i == kill_at)
        return i

    @DBOS.workflow()
    def long_workflow(n: int) -> int:
        return sum(act(i) for i in range(n))

    DBOS(config={"name": "peerbench", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()
    try:
        if mode == "die":
            with SetWorkflowID(WORKFLOW_ID):
                long_workflow(steps)
        else:
            # launch() recovered the pending workflow; wait for it as a user would.
            DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
    finally:
        DBOS.destroy()


def main(argv: list[str]) -> None:
    """Parse the arguments and run one process of the kill-and-resume."""
    system, mode, workdir, steps = argv[0], argv[1], Path(argv[2]), int(argv[3])
    kill_at = int(argv[4]) if len(argv) > 4 else -1
    if system == "stepledger":
        run_stepledger(mode, workdir, steps, kill_at, argv[5:7])
    elif system == "dbos":
        run_dbos(system, mode, workdir, steps, kill_at, f"sqlite:///{workdir / 'dbos-kill.sqlite'}")
    else:
        run_dbos(system, mode, workdir, steps, kill_at, argv[5])
    print(f"done {time.perf_counter() - STARTED:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
