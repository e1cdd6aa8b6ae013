"""How ``stepledger approvals show`` renders an approval case (plain data in, lines out)."""

from __future__ import annotations

import json
from typing import Any

from stepledger.inbox.cases import Case


def approval_summary(case: Case) -> dict[str, Any]:
    """The case as one JSON-ready object: the call shown, the saga, the decision."""
    shown = case.shown
    decision = case.decision
    return {
        "workflow_id": case.workflow_id,
        "step_id": case.step_id,
        "tool": case.subject.tool if case.subject else "",
        "status": case.subject.status if case.subject else "",
        "open": case.is_open,
        "reason": case.reason,
        "request": shown.request if shown else 0,
        "requested_at": shown.requested_at if shown else None,
        "arguments": shown.arguments if shown else None,
        "arguments_digest": shown.digest if shown else "",
        "valid_for_s": shown.valid_for_s if shown else 0,
        "saga": shown.saga if shown else None,
        "decision": None
        if decision is None
        else {
            "answer": decision.answer.value,
            "by": decision.by,
            "auth": decision.auth,
            "at": decision.at,
            "arguments_digest": decision.digest,
            "note": decision.note,
        },
    }


def approval_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as lines for a person."""
    where = f"{summary['workflow_id']}/{summary['step_id']}"
    status = summary["status"].replace("_", " ")
    lines = [f"{where}: {status} (request {summary['request']}), tool {summary['tool']}"]
    lines.append(f"reason: {summary['reason']}")
    if not summary["arguments_digest"]:
        lines.append("call: none recorded (a request from before 0.3): approving it runs nothing")
    else:
        lines.append("call (arguments as its intent will record them, secret values redacted):")
        text = json.dumps(summary["arguments"], indent=2, sort_keys=True, ensure_ascii=False)
        lines.extend("  " + line for line in text.splitlines())
        lines.append(f"digest: {summary['arguments_digest']}")
        valid = summary["valid_for_s"]
        lines.append(f"valid: {f'{valid} s once approved' if valid else 'no expiry'}")
    saga = summary["saga"] if isinstance(summary["saga"], dict) else {}
    for key, label in (
        ("happened", "already happened"),
        ("undone_if_denied", "if denied, a compensation can undo"),
        ("standing_if_denied", "stays standing whatever is answered"),
        ("committed_if_approved", "once approved and run, no longer undone"),
    ):
        steps = saga.get(key) or []
        names = ", ".join(f"{s.get('step_id')} ({s.get('tool')})" for s in steps) or "none"
        lines.append(f"{label}: {names}")
    decision = summary["decision"]
    if decision is not None:
        auth = f" ({decision['auth']})" if decision["auth"] else ""
        lines.append(
            f"decision: {decision['answer']} by {decision['by']}{auth} at {decision['at']}"
        )
    elif summary["open"] and summary["arguments_digest"]:
        digest = summary["arguments_digest"][:16]
        lines.append(
            f"to approve exactly this call: stepledger approve {summary['workflow_id']} "
            f"{summary['step_id']} --digest {digest}"
        )
    return lines
