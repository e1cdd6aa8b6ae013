"""No librdkafka type leaves ``stepledger.kafka``: the rest of the library holds none.

The import contract ``kafka-one-package`` forbids importing confluent-kafka outside the
package; this checks what an import contract cannot see: a client type handed on by a
module of the package (a re-export), or a function of it that returns a client object.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import stepledger

#: The client library's modules (its types live in its compiled ``cimpl``).
_CLIENT = ("confluent_kafka", "cimpl")
#: Client type names a return annotation may name (``from __future__``: annotations are text).
_CLIENT_TYPES = (
    "AdminClient",
    "Consumer",
    "KafkaError",
    "KafkaException",
    "Message",
    "Producer",
    "TopicPartition",
)


def _library_modules() -> list[ModuleType]:
    """Every module of stepledger outside ``stepledger.kafka``."""
    found = []
    for info in pkgutil.walk_packages(stepledger.__path__, "stepledger."):
        if info.name.startswith("stepledger.kafka") or info.name == "stepledger.__main__":
            continue
        found.append(importlib.import_module(info.name))
    return found


def _client_object(value: object) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module.split(".")[0] in _CLIENT


def _returns_client(value: object) -> bool:
    """A function of stepledger.kafka whose return annotation names a client type."""
    if not inspect.isfunction(value) or not value.__module__.startswith("stepledger.kafka"):
        return False
    returned = str(value.__annotations__.get("return", ""))
    return any(name in returned.replace("|", " ").split() for name in _CLIENT_TYPES)


def test_no_module_outside_the_kafka_package_holds_a_client_type_or_a_maker_of_one() -> None:
    held = [
        f"{module.__name__}.{name}"
        for module in _library_modules()
        for name, value in vars(module).items()
        if _client_object(value) or _returns_client(value)
    ]
    assert held == [], "librdkafka types outside stepledger.kafka"


def test_the_check_sees_a_client_type_and_a_function_that_returns_one() -> None:
    """The check would fail on what it looks for (it passes above on finding nothing)."""
    from confluent_kafka import TopicPartition

    from stepledger.kafka.broker import admin

    assert _client_object(TopicPartition) and _returns_client(admin)
    assert not _client_object(stepledger.Settings) and not _returns_client(_library_modules)
