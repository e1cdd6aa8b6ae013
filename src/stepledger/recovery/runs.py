"""Each workflow's latest claim (its run's start or resume), as the recovery tracker keeps it.

A step tracked from its intent is folded with the claim before it, so a zombie's intent
(fenced off by a newer claim) is never tracked.  The claim is kept as its value (shared
with the tracked steps folded with it); the most recently seen are also kept decoded, since
a workflow's claim is folded again with each of its steps (intent, then outcome) soon after.

Whether the kept claim *is* the latest is another matter: it is only if every earlier claim
of the workflow went through here (``known``).  The tracker knows that when it read the
workflow's partition from its start, when it read the workflow's first run start, when a
checkpoint entry carried the claims, or when it read the workflow back
(:meth:`LatestClaims.learn`); a daemon that took a partition over from a checkpoint, or
forgot a claim to stay within its bound (:attr:`LatestClaims.evicted`), does not for the
workflows that ran before, and reads one back before it decides one of its steps.

A run start read after such a take-over is taken as the workflow's first claim
(:func:`_first`), so the intents of workflows started since are tracked at once; but a
start is not always the first (two starters racing write one each, and the take-over's
position may fall between them), so such a claim is only *assumed*: enough to track, not
to vouch for a compensation (:meth:`LatestClaims.vouched`).  The daemon's compensation
claim is read back by a fold whose claims are vouched for, or by the log's own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stepledger.domain import events as ev
from stepledger.domain.state import WorkflowState, replay
from stepledger.recovery.tracked import own_codec

#: How many workflows' latest claims are remembered.
CLAIMS_KEPT = 100_000
#: How many of them are kept decoded too (the workflows that ran lately).
CLAIMS_DECODED = 4096


@dataclass(slots=True)
class _Kept:
    """A workflow's latest claim as kept (no claim: known to have none so far)."""

    event_id: str | None
    value: bytes | None
    partition: int
    generation: int
    """The partition's generation it was kept in: a partition given up forgets its claims."""
    known: bool
    """Every earlier claim of the workflow went through here: this one is the latest."""
    assumed: bool = False
    """Known only by taking a run start read after a take-over as the workflow's first."""


class LatestClaims:
    """Workflow -> its latest claim's (event id, value), the recent ones also decoded."""

    def __init__(self, kept: int = CLAIMS_KEPT, decoded: int = CLAIMS_DECODED) -> None:
        self.kept, self.decoded_kept = kept, decoded
        self._claims: OrderedDict[str, _Kept] = OrderedDict()
        self._events: OrderedDict[str, ev.Event] = OrderedDict()
        self._generations: dict[int, int] = {}
        self._partial: set[int] = set()
        """Partitions not read from their start here: not every claim before the position
        went through here (those checkpoint entries carried excepted)."""
        self.evicted = False
        """A claim was forgotten to stay within the bound: reading a partition from its start
        no longer vouches for the claims of a workflow not kept here."""

    def value(self, workflow_id: str) -> bytes | None:
        """The workflow's latest claim as a value, if one is kept."""
        kept = self._get(workflow_id)
        return None if kept is None else kept.value

    def known(self, workflow_id: str, partition: int) -> bool:
        """Whether the workflow's latest claim (or that it has none) is known for sure."""
        kept = self._get(workflow_id)
        return kept.known if kept is not None else self.complete(partition)

    def vouched(self, workflow_id: str, partition: int) -> bool:
        """Whether the workflow's claims are known without assuming a start was its first:
        what a claim with an effect (a compensation) is judged by."""
        kept = self._get(workflow_id)
        return kept.known and not kept.assumed if kept is not None else self.complete(partition)

    def complete(self, partition: int) -> bool:
        """Every claim of the partition's workflows went through here (read from its start)."""
        return partition not in self._partial and not self.evicted

    def taken_over(self, partition: int) -> None:
        """The partition is read from a position past its start (a checkpoint's, or its
        first record left after a deleted head): the claims before it did not pass here."""
        self._partial.add(partition)

    def remember(
        self, event: ev.Event, value: bytes, *, partition: int = 0, known: bool | None = None
    ) -> bool:
        """Keep the claim as its workflow's latest; False for a known, stale or competing one.

        ``known``: every earlier claim of the workflow went through here (by default: when
        its partition was read from its start).  The entry stays known once it was.
        """
        wf = event.workflow_id
        kept = self._get(wf)
        assumed = False
        if known is None:
            known = self.complete(partition)
            # A start read after a take-over may compete with one before the position.
            assumed = not known and kept is None and _first(event)
            known = known or assumed
        if kept is not None:
            if not known:  # this read vouches for nothing: the chain is known as it was
                known, assumed = kept.known, kept.assumed
            if kept.event_id == event.event_id:
                kept.known, kept.assumed = known, assumed
                return False
            if kept.value is not None:
                probe = replay(wf, [self.event(wf)])
                if probe.apply(event) is not None:
                    kept.known, kept.assumed = known, assumed
                    return False  # a stale or competing claim owns nothing
        generation = self._generation(partition)
        self._put(wf, _Kept(event.event_id, value, partition, generation, known, assumed))
        self._keep_decoded(wf, event)
        return True

    def learn(
        self, workflow_id: str, claims: Sequence[tuple[ev.Event, bytes]], partition: int
    ) -> None:
        """Know the workflow's claims from a read: all of them up to what the loop has read,
        in log order (none: it has none so far)."""
        state, latest = WorkflowState(workflow_id), None
        for event, value in claims:
            if state.apply(event) is None:
                latest = (event, value)
        generation = self._generation(partition)
        if latest is None:
            self._put(workflow_id, _Kept(None, None, partition, generation, True))
            self._events.pop(workflow_id, None)
            return
        event, value = latest
        self._put(workflow_id, _Kept(event.event_id, value, partition, generation, True))
        self._keep_decoded(workflow_id, event)

    def drop_partition(self, partition: int) -> None:
        """Forget the claims of a partition given up: its next owner may have seen newer ones."""
        self._generations[partition] = self._generation(partition) + 1
        self._partial.discard(partition)

    def event(self, workflow_id: str) -> ev.Event:
        """The workflow's latest claim, decoded (KeyError if none is kept)."""
        kept = self._get(workflow_id)
        if kept is None or kept.value is None:
            raise KeyError(workflow_id)
        event = self._events.get(workflow_id)
        if event is None or event.event_id != kept.event_id:
            event = own_codec().decode(kept.value)
            self._keep_decoded(workflow_id, event)
        return event

    def decoded(self, workflow_id: str, values: Iterable[bytes]) -> list[ev.Event]:
        """A tracked step's events, its workflow's claim taken decoded when it is known."""
        claim = self.value(workflow_id)
        decode = own_codec().decode
        return [self.event(workflow_id) if value is claim else decode(value) for value in values]

    def _get(self, workflow_id: str) -> _Kept | None:
        kept = self._claims.get(workflow_id)
        if kept is not None and kept.generation != self._generation(kept.partition):
            del self._claims[workflow_id]  # of a partition given up since
            self._events.pop(workflow_id, None)
            return None
        return kept

    def _generation(self, partition: int) -> int:
        return self._generations.get(partition, 0)

    def _put(self, workflow_id: str, kept: _Kept) -> None:
        self._claims[workflow_id] = kept
        self._claims.move_to_end(workflow_id)
        while len(self._claims) > self.kept:
            gone, _ = self._claims.popitem(last=False)
            self._events.pop(gone, None)
            self.evicted = True

    def _keep_decoded(self, workflow_id: str, event: ev.Event) -> None:
        self._events[workflow_id] = event
        self._events.move_to_end(workflow_id)
        while len(self._events) > self.decoded_kept:
            self._events.popitem(last=False)


def _first(event: ev.Event) -> bool:
    """A workflow's first run: its first claim.  Another start of it (two starters racing)
    comes after and owns nothing; its writer reads it back at open and makes no effect."""
    body = event.body
    return isinstance(body, ev.WorkflowStarted) and body.attempt == 1
