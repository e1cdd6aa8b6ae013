"""Recovery: resolve in-doubt steps by their tools' policies, and the human queue."""

from __future__ import annotations

from stepledger.deadletters.events import EventLetterSink, KafkaEventLetters, MemoryEventLetters
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
