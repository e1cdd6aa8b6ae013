"""The Tool spec: a tool's effect class, resolution policy, limits, secrets and hooks.

Hooks (all optional except where the policy needs one):

- ``run(args, idempotency_key) -> result``: the call itself.
- ``query(idempotency_key, args) -> Found | NotFound``: look the effect up.
- ``redrive(args, idempotency_key) -> result``: call again with the same key (defaults to ``run``).
- ``compensate(args, idempotency_key, known_result) -> result``: forward correcting action that
  tolerates "nothing to undo".

Recovery hooks get the arguments as the intent recorded them, secrets redacted (see
:mod:`stepledger.domain.secrets`): a tool with ``secret_args`` is re-driven or compensated
from the log only if it says its hooks fetch the secrets themselves (``hooks_fetch_secrets``)
and, for a re-drive, names a ``redrive`` hook (``run`` expects the clear arguments).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stepledger.domain import secrets
from stepledger.domain.enums import EffectClass, ResolutionPolicy
from stepledger.domain.ids import canonical_digest, canonical_json
from stepledger.errors import ToolDefinitionError


@dataclass(frozen=True)
class Found:
    """A query hook found the effect; ``result`` is what the service recorded."""

    result: Any = None


@dataclass(frozen=True)
class NotFound:
    """A query hook found no trace of the effect: it did not happen."""

    detail: str = ""


QueryAnswer = Found | NotFound
RunHook = Callable[[dict[str, Any], str], Any]
QueryHook = Callable[[str, dict[str, Any]], QueryAnswer]
RedriveHook = Callable[[dict[str, Any], str], Any]
CompensateHook = Callable[[dict[str, Any], str, Any], Any]

_DEFAULT_POLICY = {
    EffectClass.READ_ONLY: ResolutionPolicy.REDRIVE,
    EffectClass.IDEMPOTENT: ResolutionPolicy.REDRIVE,
    EffectClass.COMPENSATABLE: ResolutionPolicy.COMPENSATE,
    EffectClass.IRREVERSIBLE: ResolutionPolicy.ESCALATE,
}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_NOTHING_TO_SCRUB = secrets.Scrubber(())


class Tool(BaseModel):
    """A validated, frozen tool definition; invalid combinations are refused when it is built."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str
    """Unique tool name, recorded in every intent."""
    effect: EffectClass
    """What the effect is: read_only, idempotent, compensatable or irreversible."""
    policy: ResolutionPolicy | None = None
    """How an intent with no outcome is resolved; defaults from the effect class."""
    keyed: bool = False
    """The service de-duplicates calls by the idempotency key it is handed."""
    timeout_s: float = Field(default=30.0, gt=0, le=86_400)
    """Call timeout; it sets the intent's deadline and bounds every recovery hook."""
    max_attempts: int = Field(default=3, ge=1, le=100)
    """Recovery attempts before the step is abandoned and escalated."""
    secret_args: frozenset[str] = frozenset()
    """Secret argument paths (``card``, ``payment.card``, ``cards[].number``): never recorded."""
    hooks_fetch_secrets: bool = False
    """The redrive/compensate hooks fetch the secrets they need themselves (not from the log)."""
    requires_approval: bool = False
    """The step is a pivot: it runs only after a human approval is in the log."""
    run: RunHook | None = Field(default=None, exclude=True, repr=False)
    """The call itself: ``run(args, idempotency_key)``."""
    query: QueryHook | None = Field(default=None, exclude=True, repr=False)
    """Look the effect up by key: ``query(idempotency_key, args) -> Found | NotFound``."""
    redrive: RedriveHook | None = Field(default=None, exclude=True, repr=False)
    """Call again with the same key; ``run`` is used when absent."""
    compensate: CompensateHook | None = Field(default=None, exclude=True, repr=False)
    """Forward correction: ``compensate(args, idempotency_key, known_result)``."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            name = data.get("name", "?")
            problems = "; ".join(_describe(err) for err in exc.errors())
            raise ToolDefinitionError(f"tool {name!r}: {problems}", tool=str(name)) from None

    @model_validator(mode="after")
    def _check(self) -> Tool:
        if not _NAME.match(self.name):
            raise ValueError("name must be 1-100 letters, digits, '.', '_' or '-'")
        if self.policy is None:
            object.__setattr__(self, "policy", _DEFAULT_POLICY[self.effect])
        problems = _combination_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def resolution(self) -> ResolutionPolicy:
        """The effective resolution policy (never None once built)."""
        assert self.policy is not None
        return self.policy

    @property
    def read_only(self) -> bool:
        """True when calling the tool changes nothing anywhere."""
        return self.effect is EffectClass.READ_ONLY

    @property
    def redrive_hook(self) -> RedriveHook | None:
        """The hook a re-drive calls: ``redrive`` or else ``run``."""
        return self.redrive or self.run

    def redact(
        self, arguments: Mapping[str, Any], salt: str, key: secrets.RedactionKey | None = None
    ) -> dict[str, Any]:
        """Return the arguments with every secret value replaced by its marker.

        Without ``key`` the marker is fixed; with it, an HMAC under the operator's key,
        salted with ``salt`` (the idempotency key) so two intents never share one.
        """
        if not self.secret_args:
            return dict(arguments)
        mark = secrets.fixed_mark if key is None else secrets.keyed_mark(key, salt)
        return secrets.redact(arguments, self.secret_args, mark)

    def arguments_digest(self, arguments: Mapping[str, Any]) -> str:
        """The digest an intent records to detect a changed plan; secret values take no part."""
        if not self.secret_args:
            return canonical_digest(canonical_json(arguments))
        redacted = secrets.redact(arguments, self.secret_args, secrets.fixed_mark)
        return canonical_digest(canonical_json(redacted))

    def scrubber(self, arguments: Mapping[str, Any]) -> secrets.Scrubber:
        """What removes this call's secret values from its error text and result."""
        if not self.secret_args:
            return _NOTHING_TO_SCRUB
        return secrets.Scrubber(secrets.secret_values(arguments, self.secret_args))


def _combination_problems(tool: Tool) -> list[str]:
    policy, effect = tool.policy, tool.effect
    problems: list[str] = []
    if policy is ResolutionPolicy.REDRIVE and not (
        tool.keyed or effect in (EffectClass.IDEMPOTENT, EffectClass.READ_ONLY)
    ):
        problems.append(
            f"policy 'redrive' needs an idempotent or keyed tool, but it is {effect.value} "
            "and not keyed: a re-drive could repeat the effect"
        )
    if policy is ResolutionPolicy.COMPENSATE and effect is not EffectClass.COMPENSATABLE:
        problems.append(f"policy 'compensate' needs effect 'compensatable', not {effect.value}")
    if policy is ResolutionPolicy.QUERY and tool.query is None:
        problems.append("policy 'query' needs a query hook")
    if effect is EffectClass.COMPENSATABLE and tool.compensate is None:
        problems.append("effect 'compensatable' needs a compensate hook")
    if tool.requires_approval and effect is EffectClass.READ_ONLY:
        problems.append("a read-only tool cannot require approval: it is never a pivot")
    if tool.secret_args:
        problems.extend(secrets.path_problems(tool.secret_args))
        problems.extend(_secret_hook_problems(tool))
    return problems


def _secret_hook_problems(tool: Tool) -> list[str]:
    # Recovery and a resuming agent have only the redacted arguments: a hook handed them
    # would send the marker as the card.  Read-only steps are re-run by their agent with
    # the clear arguments, never from the log.
    if tool.effect is EffectClass.READ_ONLY:
        return []
    paths = ", ".join(sorted(map(repr, tool.secret_args)))
    problems = []
    if tool.resolution is ResolutionPolicy.REDRIVE and tool.redrive is None:
        problems.append(
            f"policy 'redrive' with secret_args ({paths}) needs a redrive hook that fetches "
            "the secrets itself (and hooks_fetch_secrets=True): recovery has only the redacted "
            "arguments, and run would be called with the marker in their place (or use "
            "policy 'query' or 'escalate')"
        )
    uses = [n for n, hook in (("redrive", tool.redrive), ("compensate", tool.compensate)) if hook]
    if uses and not tool.hooks_fetch_secrets:
        problems.append(
            f"the {' and '.join(uses)} {'hooks get' if len(uses) > 1 else 'hook gets'} only the "
            f"redacted arguments of secret_args ({paths}): declare "
            "hooks_fetch_secrets=True once they fetch the secrets they need themselves"
        )
    return problems


def _describe(err: Any) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
