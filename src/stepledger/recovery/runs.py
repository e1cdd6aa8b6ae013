"""Each workflow's latest claim (its run's start or resume), as the recovery tracker keeps it.

A step tracked from its intent is folded with the claim before it, so a zombie's intent
(fenced off by a newer claim) is never tracked.  The claim is kept as its value (shared
with the tracked steps folded with it); the most recently seen are also kept decoded, since
a workflow's claim is folded again with each of its steps (intent, then outcome) soon after.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from stepledger.domain import events as ev
from stepledger.domain.state import replay
from stepledger.recovery.tracked import own_codec

#: How many workflows' latest claims are remembered.
CLAIMS_KEPT = 100_000
#: How many of them are kept decoded too (the workflows that ran lately).
CLAIMS_DECODED = 4096


class LatestClaims:
    """Workflow -> its latest claim's (event id, value), the recent ones also decoded."""

    def __init__(self, kept: int = CLAIMS_KEPT, decoded: int = CLAIMS_DECODED) -> None:
        self.kept, self.decoded_kept = kept, decoded
        self._claims: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._events: OrderedDict[str, ev.Event] = OrderedDict()

    def value(self, workflow_id: str) -> bytes | None:
        """The workflow's latest claim as a value, if it is known."""
        known = self._claims.get(workflow_id)
        return None if known is None else known[1]

    def remember(self, event: ev.Event, value: bytes) -> bool:
        """Keep the claim as its workflow's latest; False for a known, stale or competing one."""
        wf = event.workflow_id
        known = self._claims.get(wf)
        if known is not None:
            if known[0] == event.event_id:
                return False
            probe = replay(wf, [self.event(wf)])
            if probe.apply(event) is not None:
                return False  # a stale or competing claim owns nothing
        self._claims[wf] = (event.event_id, value)
        self._claims.move_to_end(wf)
        while len(self._claims) > self.kept:
            gone, _ = self._claims.popitem(last=False)
            self._events.pop(gone, None)
        self._keep_decoded(wf, event)
        return True

    def event(self, workflow_id: str) -> ev.Event:
        """The workflow's latest claim, decoded (KeyError if none is known)."""
        event = self._events.get(workflow_id)
        if event is None:
            event = own_codec().decode(self._claims[workflow_id][1])
            self._keep_decoded(workflow_id, event)
        return event

    def decoded(self, workflow_id: str, values: Iterable[bytes]) -> list[ev.Event]:
        """A tracked step's events, its workflow's claim taken decoded when it is known."""
        claim = self.value(workflow_id)
        decode = own_codec().decode
        return [self.event(workflow_id) if value is claim else decode(value) for value in values]

    def _keep_decoded(self, workflow_id: str, event: ev.Event) -> None:
        self._events[workflow_id] = event
        self._events.move_to_end(workflow_id)
        while len(self._events) > self.decoded_kept:
            self._events.popitem(last=False)
