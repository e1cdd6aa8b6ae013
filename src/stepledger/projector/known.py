"""Which workflows the projection may hold, answered without reading the store.

Each batch asks the store which of its uncached workflows it holds (their stored events are
then replayed into the cache).  DuckDB holds every new read back while a checkpoint runs,
and the projector checkpoints for every snapshot: catching up, the main thread waited
for those answers most of the time.  Nearly every uncached workflow of a batch is
new, so a set of 64-bit fingerprints of every workflow the store may hold answers for them:
a workflow whose fingerprint is not in the set is not in the store; one whose fingerprint
is (stored, or a collision) is still asked about.  The set holds what the store held when
it was built plus every workflow folded since, added before its batch is committed; it is
a superset of the store's workflows, never less.  Past :data:`MAX_SLOTS` it is dropped and
every uncached workflow is asked about again, so its memory stays bounded (64 MB).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: Fingerprints are Python's 64-bit string hash (per process, like the set), never 0.
_MASK64 = (1 << 64) - 1
#: The largest table (8 bytes a slot; at most 3/4 full): 64 MB, ~6 million workflows.
MAX_SLOTS = 1 << 23
_MIN_SLOTS = 1 << 16

#: Calls its argument with each chunk of the workflow ids a store holds.
Scan = Callable[[Callable[[list[str]], None]], None]


class StoredWorkflows:
    """Fingerprints of every workflow a projection store may hold (open addressing)."""

    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self.max_slots = max_slots
        self._slots: memoryview | None = None
        self._count = 0
        self.enabled = True
        """False once the set outgrew ``max_slots``: every workflow may then be held."""

    @property
    def built(self) -> bool:
        """Whether the store's workflows are in the set (or it was dropped)."""
        return self._slots is not None or not self.enabled

    def build(self, count: int, scan: Scan) -> None:
        """Fill the set with the store's ``count`` workflows, read by ``scan``."""
        self._allocate(count)
        scan(self.add)

    def add(self, workflow_ids: Iterable[str]) -> None:
        """Note workflows the store may hold from now on (before their batch commits)."""
        if self._slots is None:
            return
        for workflow_id in workflow_ids:
            slots, mask = self._slots, len(self._slots) - 1
            h = hash(workflow_id) & _MASK64 or 1
            i = h & mask
            while True:
                found = slots[i]
                if found == h:
                    break
                if not found:
                    slots[i] = h
                    self._count += 1
                    if self._count * 4 > len(slots) * 3:
                        self._grow()
                    break
                i = (i + 1) & mask
            if self._slots is None:
                return

    def may_hold(self, workflow_ids: list[str]) -> list[str]:
        """The workflows among these the store may hold (all of them, unless built)."""
        slots = self._slots
        if slots is None:
            return workflow_ids
        mask = len(slots) - 1
        held = []
        for workflow_id in workflow_ids:
            h = hash(workflow_id) & _MASK64 or 1
            i = h & mask
            while True:
                found = slots[i]
                if found == h:
                    held.append(workflow_id)
                    break
                if not found:
                    break
                i = (i + 1) & mask
        return held

    def _allocate(self, count: int) -> None:
        size = _MIN_SLOTS
        while size * 3 < count * 4 + 4:
            size *= 2
        if size > self.max_slots:
            self._drop()
            return
        self._slots = memoryview(bytearray(8 * size)).cast("Q")
        self._count = 0

    def _grow(self) -> None:
        old = self._slots
        assert old is not None
        if len(old) * 2 > self.max_slots:
            self._drop()
            return
        slots = memoryview(bytearray(16 * len(old))).cast("Q")
        mask = len(slots) - 1
        for h in old:
            if h:
                i = h & mask
                while slots[i]:
                    i = (i + 1) & mask
                slots[i] = h
        self._slots = slots

    def _drop(self) -> None:
        self._slots = None
        self.enabled = False
