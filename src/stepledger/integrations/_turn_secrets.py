"""Secrets in model turns: recorded as keyed marks, replayed only where no tool needs them.

A model's response holds the arguments of the calls it asks for, secrets included.  A turn
is recorded with every form of every secret value of its calls (a tool's ``secret_args``)
replaced by a mark: the keyed HMAC of the form, salted by the workflow, with the operator's
redaction key (:mod:`stepledger.domain.secrets`), the fixed marker without one.  The same
marks stand in for those values in the requests whose digest is taken, so the next turn's
request digests alike in the run that saw the values and in a resume that replayed marks.

A recorded turn whose calls carried secrets is replayed only when each of those calls has
a settled step this run has not used yet: the call then replays that step's outcome and
no tool is called.  Otherwise (a call with no intent yet, or one in doubt that a re-drive
would call again) the model is asked again and gives the values anew: a tool never
receives a mark in place of a value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from stepledger.domain import secrets
from stepledger.domain.replay import occurrences
from stepledger.domain.state import StepState, StepStatus
from stepledger.domain.tools import Tool
from stepledger.domain.usage import SECRET_CALLS_KEY
from stepledger.integrations._schema import model_name

if TYPE_CHECKING:
    from stepledger.producer.workflow import Workflow

Calls = Callable[[Any], Iterable[tuple[str, Mapping[str, Any]]]]
"""The tool calls of a response as JSON: (the tool's name as the model saw it, arguments)."""
_SETTLED = frozenset({StepStatus.SUCCEEDED, StepStatus.FAILED})


class TurnSecrets:
    """The secret values a run's model turns carried, and the marks that stand in for them."""

    def __init__(self, workflow: Workflow) -> None:
        self.workflow = workflow
        self._values: list[Any] = []
        self._scrubber = secrets.Scrubber(())

    def _mark(self, form: str) -> str:
        # A value found as a JSON string (quotes and all) stays a JSON string: arguments
        # recorded as JSON text (the OpenAI Agents SDK's) must still parse on a replay.
        if len(form) >= 2 and form[0] == form[-1] == '"':
            return f'"{self._mark(form[1:-1])}"'
        key = self.workflow.ledger.events.redaction_key
        if key is None:
            return secrets.MARKER
        return key.mark("stepledger.model-turn", self.workflow.workflow_id, form)

    def hide(self, response: Any, calls: Calls | None, tools: Mapping[str, Tool]) -> Any:
        """The response with its calls' secrets marked, and the tools whose calls had them."""
        found: list[str] = []
        for name, arguments in calls(response) if calls is not None else ():
            tool = _by_model_name(tools, name)
            if tool is None or not tool.secret_args or not isinstance(arguments, Mapping):
                continue
            values = secrets.secret_values(arguments, tool.secret_args)
            if values:
                found.append(tool.name)
                self._values += values
        if found:
            self._scrubber = secrets.Scrubber(self._values, self._mark)
        return self.scrub(response), found

    def scrub(self, value: Any) -> Any:
        """A JSON-like value (a request, a response) with every secret seen so far marked."""
        return self._scrubber.value(value) if self._scrubber else value

    def replayable(self, turn: Any, used: set[str]) -> bool:
        """Whether each secret-bearing call of a recorded turn has a settled step to replay."""
        needed = Counter(turn.get(SECRET_CALLS_KEY) or []) if isinstance(turn, dict) else Counter()
        state = self.workflow.state
        for tool, count in needed.items():
            settled = [s for s in occurrences(state, tool) if s.step_id not in used and _settled(s)]
            if len(settled) < count:
                return False
        return True

    def replayed_step(self, tool: Tool, arguments: Mapping[str, Any], used: set[str]) -> str | None:
        """The settled step a call carrying marks (from a replayed turn) replays, if it does.

        None for a call without marks (the values are clear: the usual path).
        """
        if not tool.secret_args or not _carries_marks(arguments, tool.secret_args):
            return None
        for step in occurrences(self.workflow.state, tool.name):
            if step.step_id not in used and _settled(step):
                return step.step_id
        return ""


def _settled(step: StepState) -> bool:
    return step.status in _SETTLED and not step.in_doubt


def _carries_marks(arguments: Mapping[str, Any], paths: frozenset[str]) -> bool:
    return any(
        isinstance(v, str) and (v == secrets.MARKER or v.startswith(secrets.HMAC_PREFIX))
        for v in secrets.secret_values(arguments, paths)
    )


def _by_model_name(tools: Mapping[str, Tool], name: str) -> Tool | None:
    found = tools.get(name)
    if found is not None:
        return found
    return next((t for t in tools.values() if model_name(t) == name), None)
