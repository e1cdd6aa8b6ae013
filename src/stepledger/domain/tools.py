"""The Tool spec: a tool's two effect properties, resolution policy, limits, secrets and hooks.

A tool's effect has two independent properties (DESIGN invariant 12):

- **may it be repeated safely?** ``keyed`` (the service de-duplicates by the idempotency key)
  or ``idempotent`` (calling twice is calling once);
- **can it be undone?** it has a ``compensate`` hook: a forward action (a refund, a
  cancellation) with its own key, tolerant of "nothing to undo".

``read_only`` is its own case (nothing changes anywhere).  Every combination is allowed: a
keyed charge with a refund is both.  The recovery policy defaults follow from the pair
(``read_only``/repeatable: re-drive; only undoable: compensate; neither: escalate).  The
older ``effect=`` classes map onto the pair (``idempotent`` -> idempotent, ``compensatable``
-> needs a compensate hook, ``irreversible`` -> no compensate hook), and ``Tool.effect`` is
always the class the pair implies (undoable -> compensatable, else repeatable -> idempotent,
else irreversible), which is what intents record for older readers.

Hooks (all optional except where the policy needs one) take their arguments in one order,
the call's arguments first and its idempotency key second:

- ``run(args, idempotency_key) -> result``: the call itself.
- ``query(args, idempotency_key) -> Found | NotFound``: look the effect up.
- ``redrive(args, idempotency_key) -> result``: call again with the same key (defaults to ``run``).
- ``compensate(args, idempotency_key, known_result) -> result``: forward correcting action that
  tolerates "nothing to undo".

Recovery hooks get the arguments as the intent recorded them, secrets redacted (see
:mod:`stepledger.domain.secrets`): a tool with ``secret_args`` is re-driven or compensated
from the log only if it says its hooks fetch the secrets themselves (``hooks_fetch_secrets``)
and, for a re-drive, names a ``redrive`` hook (``run`` expects the clear arguments).

A call is identified by its fingerprint (:mod:`stepledger.domain.fingerprint`): the tool,
the step and the arguments named in ``identity_args`` (every argument by default), secrets
as keyed marks.  Free text a model may word otherwise (a memo, an email body) belongs
outside ``identity_args``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from stepledger.domain import fingerprint as calls
from stepledger.domain import secrets
from stepledger.domain.enums import EffectClass, ResolutionPolicy
from stepledger.domain.results import ResultCodec, result_codec
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
QueryHook = Callable[[dict[str, Any], str], QueryAnswer]
RedriveHook = Callable[[dict[str, Any], str], Any]
CompensateHook = Callable[[dict[str, Any], str, Any], Any]

_LEGACY_POLICY = {
    EffectClass.READ_ONLY: ResolutionPolicy.REDRIVE,
    EffectClass.IDEMPOTENT: ResolutionPolicy.REDRIVE,
    EffectClass.COMPENSATABLE: ResolutionPolicy.COMPENSATE,
    EffectClass.IRREVERSIBLE: ResolutionPolicy.ESCALATE,
}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_ARGUMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NOTHING_TO_SCRUB = secrets.Scrubber(())


class Tool(BaseModel):
    """A validated, frozen tool definition; invalid combinations are refused when it is built."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str
    """Unique tool name, recorded in every intent."""
    effect: EffectClass | None = None
    """Older spelling of the two properties; once built, the class the pair implies."""
    read_only: bool = False
    """Calling the tool changes nothing anywhere (a search, a quote)."""
    idempotent: bool = False
    """Calling it twice with the same arguments is calling it once (an upsert)."""
    keyed: bool = False
    """The service de-duplicates calls by the idempotency key it is handed."""
    policy: ResolutionPolicy | None = None
    """How an intent with no outcome is resolved; defaults from the two properties."""
    correction: str = ""
    """For an effect that cannot be undone: the forward action a human might take instead."""
    timeout_s: float = Field(default=30.0, gt=0, le=86_400)
    """Call timeout; it sets the intent's deadline and bounds every recovery hook."""
    max_attempts: int = Field(default=3, ge=1, le=100)
    """Recovery attempts before the step is abandoned and escalated."""
    secret_args: frozenset[str] = frozenset()
    """Secret argument paths (``card``, ``payment.card``, ``cards[].number``): never recorded."""
    identity_args: frozenset[str] | None = None
    """The arguments that identify the call's effect (None: every argument); a call that
    differs only in the others (a memo, an email body) is the same call."""
    hooks_fetch_secrets: bool = False
    """The redrive/compensate hooks fetch the secrets they need themselves (not from the log)."""
    requires_approval: bool = False
    """The step is a pivot: it runs only after a human approval of the exact call is in the log."""
    approval_valid_for: float | None = Field(default=None, gt=0, le=365 * 86_400)
    """Seconds an approval stays valid once given; a later call asks again (None: no expiry)."""
    run: RunHook | None = Field(default=None, exclude=True, repr=False)
    """The call itself: ``run(args, idempotency_key)``."""
    query: QueryHook | None = Field(default=None, exclude=True, repr=False)
    """Look the effect up by key: ``query(args, idempotency_key) -> Found | NotFound``."""
    redrive: RedriveHook | None = Field(default=None, exclude=True, repr=False)
    """Call again with the same key; ``run`` is used when absent."""
    compensate: CompensateHook | None = Field(default=None, exclude=True, repr=False)
    """Undo it: ``compensate(args, idempotency_key, known_result)``, a forward action."""
    result_type: Any = Field(default=None, exclude=True, repr=False)
    """What ``run`` returns (default: its return annotation); replays return that type."""
    _results: ResultCodec = PrivateAttr()
    _function: Callable[..., Any] | None = PrivateAttr(default=None)

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
        problems = _legacy_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        if self.policy is None and self.effect is not None:
            # An older declaration keeps the default policy its class always had.
            object.__setattr__(self, "policy", _LEGACY_POLICY[self.effect])
        if self.effect is EffectClass.READ_ONLY:
            object.__setattr__(self, "read_only", True)
        elif self.effect is EffectClass.IDEMPOTENT:
            object.__setattr__(self, "idempotent", True)
        object.__setattr__(self, "effect", _implied_class(self))
        if self.policy is None:
            object.__setattr__(self, "policy", _default_policy(self))
        problems = _combination_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        self._results = result_codec(self.result_type, self.run, tool=self.name)
        return self

    def bind_function(self, fn: Callable[..., Any]) -> None:
        """Remember the plain function a decorated tool was made of (calling the tool calls it)."""
        self._function = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function a decorated tool was made of, directly (no intent, no outcome)."""
        if self._function is None:
            raise TypeError(f"tool {self.name!r} was not made from a function; use wf.step")
        return self._function(*args, **kwargs)

    @property
    def results(self) -> ResultCodec:
        """How this tool's results are recorded and replayed (same value, same type)."""
        # Read from pydantic's private store directly: ``self._results`` goes through
        # ``BaseModel.__getattr__`` on every step.
        return cast(ResultCodec, self.__pydantic_private__["_results"])  # type: ignore[index]

    @property
    def effect_class(self) -> EffectClass:
        """The effect class the two properties imply (never None once built)."""
        assert self.effect is not None
        return self.effect

    @property
    def resolution(self) -> ResolutionPolicy:
        """The effective resolution policy (never None once built)."""
        assert self.policy is not None
        return self.policy

    @property
    def effectful(self) -> bool:
        """True when calling the tool changes something outside stepledger."""
        return not self.read_only

    @property
    def repeatable(self) -> bool:
        """True when a repeat is safe: read-only, idempotent or keyed."""
        return self.read_only or self.idempotent or self.keyed

    @property
    def undoable(self) -> bool:
        """True when the effect can be undone: the tool has a compensate hook."""
        return self.compensate is not None

    @property
    def pivot(self) -> bool:
        """True when the tool's effect cannot be undone: a step of it is a saga's pivot."""
        return self.effectful and not self.undoable

    @property
    def redrive_hook(self) -> RedriveHook | None:
        """The hook a re-drive calls: ``redrive`` or else ``run``."""
        return self.redrive or self.run

    def redact(
        self,
        arguments: Mapping[str, Any],
        key: secrets.RedactionKey | None = None,
        *,
        workflow_id: str = "",
        step_id: str = "",
    ) -> dict[str, Any]:
        """Return the arguments with every secret value replaced by its marker.

        Without ``key`` the marker is fixed; with it, an HMAC under the operator's key,
        salted with the workflow and the step (see :mod:`stepledger.domain.secrets`).
        """
        return calls.redacted(arguments, self.secret_args, workflow_id, step_id, key)

    def recorded_arguments(
        self,
        arguments: Mapping[str, Any],
        *,
        workflow_id: str,
        step_id: str,
        key: secrets.RedactionKey | None = None,
    ) -> tuple[str, str]:
        """A call's ``arguments_json`` and its fingerprint (the intent's ``arguments_digest``).

        Raises ToolDefinitionError for a tool whose approval could not bind its secrets
        (approval and secret arguments, no redaction key).
        """
        self.ensure_bindable(key)
        return calls.recorded(
            self.name,
            arguments,
            secret_args=self.secret_args,
            identity_args=self.identity_args,
            workflow_id=workflow_id,
            step_id=step_id,
            key=key,
        )

    def fingerprint(
        self,
        arguments: Mapping[str, Any],
        *,
        workflow_id: str,
        step_id: str,
        key: secrets.RedactionKey | None = None,
    ) -> str:
        """The call's fingerprint: tool, step and identifying arguments, secrets as marks.

        What step identity, the plan check and approvals compare (see
        :mod:`stepledger.domain.fingerprint`).
        """
        return self.recorded_arguments(
            arguments, workflow_id=workflow_id, step_id=step_id, key=key
        )[1]

    def ensure_bindable(self, key: secrets.RedactionKey | None) -> None:
        """Raise ToolDefinitionError when an approval of this tool could not bind its secrets.

        A tool that requires approval and has secret arguments needs a redaction key: the
        approval binds secret values only as keyed HMACs.
        """
        calls.ensure_bindable(self.name, self.secret_args, self.requires_approval, key)

    def legacy_digest(self, arguments: Mapping[str, Any]) -> str:
        """The digest intents recorded before fingerprints (every argument, secrets fixed)."""
        return calls.legacy(arguments, self.secret_args)

    def scrubber(self, arguments: Mapping[str, Any]) -> secrets.Scrubber:
        """What removes this call's secret values from its error text and result."""
        if not self.secret_args:
            return _NOTHING_TO_SCRUB
        return secrets.Scrubber(secrets.secret_values(arguments, self.secret_args))


def _legacy_problems(tool: Tool) -> list[str]:
    """Contradictions between an ``effect=`` class and the properties given beside it."""
    effect, problems = tool.effect, list[str]()
    if effect is None:
        return problems
    if effect is EffectClass.COMPENSATABLE and tool.compensate is None:
        problems.append("effect 'compensatable' needs a compensate hook")
    if effect is EffectClass.IRREVERSIBLE and tool.compensate is not None:
        problems.append("effect 'irreversible' contradicts its compensate hook: drop effect=")
    if effect is not EffectClass.READ_ONLY and tool.read_only:
        problems.append(f"effect {effect.value!r} contradicts read_only=True")
    return problems


def _implied_class(tool: Tool) -> EffectClass:
    if tool.read_only:
        return EffectClass.READ_ONLY
    if tool.undoable:
        return EffectClass.COMPENSATABLE
    return EffectClass.IDEMPOTENT if tool.repeatable else EffectClass.IRREVERSIBLE


def _default_policy(tool: Tool) -> ResolutionPolicy:
    # Going forward is the default wherever a repeat is safe; undoing only where it is not.
    if tool.repeatable:
        return ResolutionPolicy.REDRIVE
    return ResolutionPolicy.COMPENSATE if tool.undoable else ResolutionPolicy.ESCALATE


def _combination_problems(tool: Tool) -> list[str]:
    policy = tool.policy
    problems: list[str] = []
    if policy is ResolutionPolicy.REDRIVE and not tool.repeatable:
        problems.append(
            "policy 'redrive' needs a tool whose repeat is safe (keyed or idempotent), but it "
            "is neither: a re-drive could repeat the effect"
        )
    if policy is ResolutionPolicy.COMPENSATE and not tool.undoable:
        problems.append("policy 'compensate' needs a compensate hook (an undo)")
    if policy is ResolutionPolicy.QUERY and tool.query is None:
        problems.append("policy 'query' needs a query hook")
    if tool.read_only and tool.compensate is not None:
        problems.append("a read-only tool has nothing to undo: drop its compensate hook")
    if tool.requires_approval and tool.read_only:
        problems.append("a read-only tool cannot require approval: it is never a pivot")
    if tool.approval_valid_for is not None and not tool.requires_approval:
        problems.append("approval_valid_for needs requires_approval=True")
    if tool.identity_args is not None:
        problems.extend(_identity_problems(tool.identity_args))
    if tool.secret_args:
        problems.extend(secrets.path_problems(tool.secret_args))
        problems.extend(_secret_hook_problems(tool))
    return problems


def _identity_problems(names: frozenset[str]) -> list[str]:
    invalid = sorted(repr(n) for n in names if not isinstance(n, str) or not _ARGUMENT.match(n))
    if not invalid:
        return []
    return [f"identity_args {', '.join(invalid)}: name top-level arguments (letters, digits, '_')"]


def _secret_hook_problems(tool: Tool) -> list[str]:
    # Recovery and a resuming agent have only the redacted arguments: a hook handed them
    # would send the marker as the card.  Read-only steps are re-run by their agent with
    # the clear arguments, never from the log.
    if tool.read_only:
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
