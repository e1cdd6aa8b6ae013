"""Calling a tool's recovery hooks: bounded by the tool's timeout, arguments from the intent."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from stepledger.domain.state import StepState
from stepledger.domain.tools import Found, NotFound, QueryHook
from stepledger.errors import HookTimeoutError, RecoveryError


def call_bounded(hook: Callable[..., Any], args: tuple[Any, ...], timeout: float, name: str) -> Any:
    """Call a hook on a daemon thread and wait at most ``timeout`` seconds for its answer.

    A hook still running at the timeout raises HookTimeoutError here; its thread cannot be
    killed and is left to finish (daemon, so it never keeps the process from exiting).
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["answer"] = hook(*args)
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name=f"hook-{name}", daemon=True).start()
    if not done.wait(timeout):
        raise HookTimeoutError(f"hook {name} did not answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("answer")


def checked_query(query: QueryHook) -> Callable[[str, dict[str, Any]], Found | NotFound]:
    """Wrap a query hook so an answer that is neither Found nor NotFound is an error."""

    def run(key: str, arguments: dict[str, Any]) -> Found | NotFound:
        answer = query(key, arguments)
        if not isinstance(answer, Found | NotFound):
            raise RecoveryError(f"query answered {type(answer).__name__}, not Found/NotFound")
        return answer

    return run


def intent_arguments(step: StepState) -> dict[str, Any]:
    """The intent's arguments as recorded.

    Secret fields are redacted in the log, so a hook that needs a secret must fetch it
    itself (from its own vault), never from the intent.
    """
    loaded = json.loads(step.arguments_json or "{}")
    return loaded if isinstance(loaded, dict) else {"value": loaded}


def known_result(step: StepState) -> Any:
    """The result the log knows for the step (for a compensation), or None."""
    return None if step.result_json is None else json.loads(step.result_json)
