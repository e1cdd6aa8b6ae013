"""A tiny agent whose pivot wires money, gated by an approval of the exact call.

``agent_wire.py BOOTSTRAP TOPIC WORKFLOW AMOUNT TO [VALID_FOR_S]``: each wire actually sent
is a JSON line appended to the file ``$WIRES`` (the bank).  Exit 0 once wired (or
replayed), 3 while the approval is pending, 4 when denied.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pydantic import SecretStr

from stepledger.config import Settings
from stepledger.domain.tools import Tool
from stepledger.errors import ApprovalDeniedError, ApprovalPendingError
from stepledger.producer import Ledger


def wire(args: dict[str, Any], key: str) -> dict[str, Any]:
    with open(os.environ["WIRES"], "a", encoding="utf-8") as bank:
        bank.write(json.dumps({**args, "key": key}) + "\n")
    return {"wired": key}


def main(argv: list[str]) -> int:
    bootstrap, topic, workflow_id, amount, to = argv[:5]
    expiry = {"approval_valid_for": float(argv[5])} if len(argv) > 5 else {}
    tool = Tool(
        name="wire",
        effect="irreversible",
        requires_approval=True,
        secret_args=frozenset({"pin"}),
        run=wire,
        **expiry,
    )
    hold = Tool(
        name="hold",
        effect="compensatable",
        run=lambda a, k: {"hold": k},
        compensate=lambda a, k, r: None,
    )
    # The operator's redaction key: an approval binds the secret pin only as a keyed HMAC.
    settings = Settings(
        bootstrap=bootstrap,
        topic=topic,
        fleet_id="bank",
        producer_id="agent",
        redaction_key=SecretStr("agent-wire-redaction-key"),
    )
    ledger = Ledger(settings)
    try:
        wf = ledger.workflow(workflow_id, max_attempts=20)  # each run is a resume
        wf.step("hold", hold, nights=1)
        result = wf.step("wire", tool, amount=int(amount), to=to, pin="1234")
        print(json.dumps(result), flush=True)
        return 0
    except ApprovalPendingError as exc:
        print(exc.message, flush=True)
        return 3
    except ApprovalDeniedError as exc:
        print(exc.message, flush=True)
        return 4
    finally:
        ledger.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
