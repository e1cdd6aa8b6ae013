"""A result too large for one record: recorded as a digest, never a re-drive loop.

The call happened, so its outcome must be recorded: a ``DurabilityError`` would say "not
attempted" and every resume would call the tool again, to fail again.  An outcome whose
result would not fit the record limit that applies (the producer's ``message.max.bytes``
and the step log's own ``max.message.bytes``, whichever is smaller) is recorded as
succeeded with the result cut to its size, its sha256 and its first characters (result
type ``!too_large``); the run that made the call and every replay then raise one clear
:class:`~stepledger.errors.ResultTypeError` naming the step, and the tool is never called
again for it.  Recovery's outcomes (a re-drive's, a query's) and the evidence beside them
(what a hook answered) are cut the same way, so no result can make a decision impossible
to record.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stepledger.domain.ids import canonical_json
from stepledger.domain.results import UNREPLAYABLE, Encoded
from stepledger.domain.state import StepState
from stepledger.domain.tools import Tool
from stepledger.errors import ResultTypeError

TOO_LARGE = UNREPLAYABLE + "too_large"
#: Room left in a record for the envelope, the outcome's other fields and the headers.
ENVELOPE_ROOM = 16 * 1024
#: How much of the result's text the recorded digest keeps, for a human to recognise it.
HEAD_CHARS = 512
#: An escalation's evidence is for a person to read; beyond this it is kept as its digest,
#: so an escalation fits any record limit and giving up can always be recorded.
EVIDENCE_KEPT = 4096


def record_limit(max_message_bytes: int) -> int:
    """The most bytes a recorded result may take in records of at most ``max_message_bytes``.

    The envelope's room is kept, and at least half of a small limit (a topic's own
    ``max.message.bytes`` may be far below the producer's) is left to it.
    """
    return max(max_message_bytes // 2, max_message_bytes - ENVELOPE_ROOM)


def fitted(encoded: Encoded, limit: int) -> Encoded:
    """``encoded`` when its JSON fits ``limit`` bytes, else its digest, marked not replayable."""
    if encoded.value is None:
        return encoded
    text = canonical_json(encoded.value)
    size = len(text.encode())
    if size <= limit:
        return encoded
    kept = {**digest(text), "result_type": encoded.result_type}
    problem = (
        f"its result ({size} bytes) is larger than a record may hold ({limit} bytes under "
        "message.max.bytes); only its size and sha256 were kept; return a reference to "
        "where the data is stored instead"
    )
    return Encoded(kept, TOO_LARGE, problem)


def can_cut(encoded: Encoded) -> bool:
    """True when a result could be recorded smaller (it is not empty nor a digest already)."""
    return encoded.value is not None and encoded.result_type != TOO_LARGE


def digest(text: str) -> dict[str, Any]:
    """What is kept of JSON too large to record: its size, sha256 and first characters."""
    data = text.encode()
    return {
        "truncated": True,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "head": text[:HEAD_CHARS],
    }


def fitted_value(value: Any, limit: int) -> Any:
    """A JSON-ready value as recorded beside a result (evidence): itself, or its digest."""
    text = canonical_json(value)
    return value if len(text.encode()) <= limit else digest(text)


def ensure_kept(tool: Tool, step: StepState) -> None:
    """Raise the clear error of a replayed step whose result was too large to record."""
    if step.result_type != TOO_LARGE or step.result_json is None:
        return
    raise too_large(tool.name, step.step_id, json.loads(step.result_json))


def ensure_fits(tool: Tool, step_id: str, encoded: Encoded) -> None:
    """Raise, once the outcome is recorded, if the result was cut to its digest."""
    if encoded.result_type == TOO_LARGE:
        raise too_large(tool.name, step_id, encoded.value)


def too_large(tool: str, step_id: str, kept: dict[str, Any]) -> ResultTypeError:
    """The one error of a step whose result was too large to record (first run and replays)."""
    return ResultTypeError(
        f"step {step_id!r} ({tool}): the call succeeded but its result "
        f"({kept.get('bytes')} bytes, sha256 {str(kept.get('sha256'))[:16]}) is larger than "
        "a record may hold and was not kept; the tool is not called again; return a "
        "reference to where the data is stored instead",
        step_id=step_id,
        tool=tool,
    )
