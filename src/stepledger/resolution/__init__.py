"""What the SDK and the recovery daemon both need, below both of them.

The one resolution code path (:class:`Resolver`: query, re-drive, compensate, escalate,
each decision recorded as events), the hook pool that bounds tool hooks, the tool
registry, and the sinks for dead letters.  ``stepledger.producer`` and
``stepledger.recovery`` import from here; nothing here imports either of them.
"""

from __future__ import annotations

from stepledger.deadletters.events import (
    EventLetterSink,
    KafkaEventLetters,
    MemoryEventLetters,
)
from stepledger.resolution.hooks import call_bounded
from stepledger.resolution.registry import ToolRegistry, load_registries, load_registry
from stepledger.resolution.resolver import Resolution, Resolver

__all__ = [
    "EventLetterSink",
    "KafkaEventLetters",
    "MemoryEventLetters",
    "Resolution",
    "Resolver",
    "ToolRegistry",
    "call_bounded",
    "load_registries",
    "load_registry",
]
