"""What a model turn cost: its usage, its price, the budget it is checked against.

Pure: no I/O.  A recorded model turn (a read-only step, tool ``model``) keeps the usage the
framework reported for that one request beside the response, in the step's result
(:func:`recorded`), so the log alone says what every turn cost; a replay reads it back
(:func:`unrecorded`) and reports it as reused, never as spent again.  Token counts follow
the providers: ``input_tokens`` counts every prompt token, ``cached_tokens`` the part of
them read from the provider's cache; ``output_tokens`` every generated token,
``reasoning_tokens`` the part of them the model spent thinking.

A price table is the operator's, per model (none ships as fact: prices change), in units
of currency per million tokens::

    [models."gpt-4o"]
    input = 2.5
    cached_input = 1.25
    output = 10.0
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stepledger.errors import ConfigError

RESPONSE_KEY = "response"
"""The key of a recorded turn's response in its step's result."""
USAGE_KEY = "usage"
"""The key of a recorded turn's usage in its step's result."""
SECRET_CALLS_KEY = "secret_calls"
"""The key, in a recorded turn's result, of the tools whose calls in it carried secrets."""
_PER = 1_000_000
"""Prices are per million tokens."""


class TurnUsage(BaseModel):
    """The tokens one model request spent, as the framework reported them, and its cost."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    model: str | None = None
    """The model that answered (the framework's name for it), when known."""
    input_tokens: int = Field(default=0, ge=0)
    """Every prompt token (cached ones included)."""
    output_tokens: int = Field(default=0, ge=0)
    """Every generated token (reasoning ones included)."""
    cached_tokens: int = Field(default=0, ge=0)
    """Prompt tokens read from the provider's cache (part of ``input_tokens``)."""
    reasoning_tokens: int = Field(default=0, ge=0)
    """Generated tokens spent reasoning (part of ``output_tokens``)."""
    cost: float | None = None
    """The turn's cost by the configured price table, or None without a price for the model."""

    @property
    def tokens(self) -> int:
        """Input and output tokens: what a token budget counts."""
        return self.input_tokens + self.output_tokens


class ModelPrice(BaseModel):
    """One model's prices, per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    """Price of an uncached prompt token."""
    output: float = Field(ge=0)
    """Price of a generated token (reasoning tokens included)."""
    cached_input: float | None = Field(default=None, ge=0)
    """Price of a cached prompt token; the input price when not given."""


class PriceTable(BaseModel):
    """The operator's prices per model (exact model names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, ModelPrice] = Field(default_factory=dict)
    """Prices by model name."""

    def cost(self, usage: TurnUsage) -> float | None:
        """The turn's cost, or None when the table has no price for its model."""
        price = self.models.get(usage.model or "")
        if price is None:
            return None
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_price = price.input if price.cached_input is None else price.cached_input
        total = (
            (usage.input_tokens - cached) * price.input
            + cached * cached_price
            + usage.output_tokens * price.output
        )
        return total / _PER

    def priced(self, usage: TurnUsage) -> TurnUsage:
        """The usage with its cost from this table (kept as reported when there is none)."""
        cost = self.cost(usage)
        return usage if cost is None else usage.model_copy(update={"cost": cost})


def price_table(data: Mapping[str, Any]) -> PriceTable:
    """A price table from parsed TOML (``[models."NAME"]`` tables); raises ConfigError."""
    try:
        return PriceTable.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"price table: {where}: {first['msg']}") from None


def recorded(response: Any, usage: TurnUsage | None) -> dict[str, Any]:
    """A model step's result: the framework's response and the turn's usage beside it."""
    return {RESPONSE_KEY: response, USAGE_KEY: None if usage is None else usage.model_dump()}


def unrecorded(result: Any) -> tuple[Any, TurnUsage | None]:
    """A model step's result as (response, usage); a turn recorded before usage has none."""
    if isinstance(result, dict) and _TURN_KEYS <= set(result) <= _TURN_KEYS | {SECRET_CALLS_KEY}:
        usage = result[USAGE_KEY]
        return result[RESPONSE_KEY], None if usage is None else TurnUsage.model_validate(usage)
    return result, None


_TURN_KEYS = frozenset({RESPONSE_KEY, USAGE_KEY})


def usage_of(result_json: str | None) -> TurnUsage | None:
    """The usage a recorded model step's result holds, or None (no result, older record)."""
    if not result_json:
        return None
    try:
        return unrecorded(json.loads(result_json))[1]
    except (ValueError, ValidationError):
        return None


class Volatile(BaseModel):
    """Parts of a model request that change on every run and must not change its digest.

    A prompt that carries the time (or a request id) is another request on every resume,
    so its recorded turn would never be replayed.  Declare what varies: each match of a
    pattern is cut out of every string of the request, each key is left out of every
    object, before the request's digest is taken.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    patterns: tuple[str, ...] = ()
    """Regular expressions whose matches are cut out of every string of the request."""
    keys: frozenset[str] = frozenset()
    """Object keys left out of the request, wherever they occur."""

    def model_post_init(self, __context: Any) -> None:
        """Refuse a pattern that is not a regular expression (at definition, not at a turn)."""
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"volatile pattern {pattern!r}: {exc}") from None

    def strip(self, value: Any) -> Any:
        """The JSON-like value without its volatile parts."""
        if not self.patterns and not self.keys:
            return value
        return _strip(value, [re.compile(p) for p in self.patterns], self.keys)


def _strip(value: Any, patterns: list[re.Pattern[str]], keys: frozenset[str]) -> Any:
    if isinstance(value, str):
        for pattern in patterns:
            value = pattern.sub("", value)
        return value
    if isinstance(value, dict):
        return {k: _strip(v, patterns, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list | tuple):
        return [_strip(v, patterns, keys) for v in value]
    return value


def total(usages: Iterable[TurnUsage]) -> tuple[int, float]:
    """Tokens and cost of some turns (a turn without a cost adds none)."""
    tokens, cost = 0, 0.0
    for usage in usages:
        tokens += usage.tokens
        cost += usage.cost or 0.0
    return tokens, cost


class Budget(BaseModel):
    """What one workflow may spend on model calls, over all its runs (None: no limit).

    Checked before every call that asks a model, against the turns the workflow's log
    recorded: one live runner per workflow and the partition's order make it exact up to
    one turn (the call that crosses the limit is made; the next one is refused).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: int | None = Field(default=None, ge=0)
    """Input and output tokens."""
    cost: float | None = Field(default=None, ge=0)
    """Cost by the price table (a turn without a price adds nothing)."""

    def refusal(self, tokens: int, cost: float) -> str | None:
        """Why a workflow that spent this may not ask a model again, or None."""
        if self.tokens is not None and tokens >= self.tokens:
            return f"spent {tokens} of its {self.tokens} tokens"
        if self.cost is not None and cost >= self.cost:
            return f"spent {cost:.6g} of its {self.cost:.6g} cost"
        return None
