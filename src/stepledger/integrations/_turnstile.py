"""The order of a model turn's tool calls: one at a time, in the response's order, no clock."""

from __future__ import annotations

from collections.abc import Iterable

from stepledger.errors import ToolDefinitionError


class Turnstile:
    """Holds the tool calls of one model turn to the response's order, with no clock.

    The framework dispatches a turn's calls one at a time, in the response's order (the
    OpenAI Agents SDK with ``max_function_tool_concurrency=1``, which
    :func:`stepledger.integrations.openai_agents.run` sets): a call starts only once every
    call before it has finished or was passed over by the framework, from the framework's
    own data (its own approval, a guardrail's rejection, arguments the tool refuses), and a
    call passed over never arrives.  So an arriving call waits for nothing: it only checks
    that this holds.  A call that arrives while another call of its turn runs, or after a
    later call of its turn, shows a framework running the turn's calls concurrently, and is
    refused before any step of it is recorded rather than let the event loop pick the order
    of steps.
    """

    def __init__(self) -> None:
        self._order: dict[str, int] = {}
        self._last = -1
        self._running: str | None = None

    def expect(self, call_ids: Iterable[str]) -> None:
        """The call ids of the latest model turn, in the order the model gave them."""
        self._order = {}
        for call_id in call_ids:
            if call_id:
                self._order.setdefault(call_id, len(self._order))
        self._last, self._running = -1, None

    def enter(self, call_id: str | None) -> None:
        """Let a call of the turn start: every call before it is settled, none after it began.

        Calls that are not the turn's (a plain tool, a call id the turn did not give) pass.
        Raises ToolDefinitionError when the framework runs the turn's calls concurrently.
        """
        index = self._order.get(call_id) if call_id else None
        if index is None:
            return
        if self._running is not None or index <= self._last:
            ahead = self._running or next(c for c, i in self._order.items() if i == self._last)
            doing = "is running" if self._running is not None else "started"
            raise ToolDefinitionError(
                f"tool call {call_id!r} (number {index + 1} of its model turn) arrived after "
                f"call {ahead!r} of the same turn {doing}: the framework runs a turn's tool "
                "calls concurrently, and stepledger runs them one at a time in the model's "
                "order, so that the order of steps never depends on the event loop; start the "
                "agent with the integration's run(), which has the framework run them in order"
            )
        self._last, self._running = index, call_id

    def leave(self, call_id: str | None) -> None:
        """Mark a call finished, whatever its outcome."""
        if call_id is not None and call_id == self._running:
            self._running = None
