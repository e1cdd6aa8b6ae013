"""Secret arguments: declared paths, their redaction, and scrubbing them out of texts.

A tool declares which argument fields are secret by path: ``"card"``, ``"payment.card"``
(a field of a nested object) or ``"cards[].number"`` (that field of every element of a
list; ``"tokens[]"`` makes every element secret).  What leaves the process is:

- in the intent's arguments, each secret value replaced by :data:`MARKER`, or, when the
  operator configured a redaction key, by ``[redacted:hmac-sha256:<32 hex>]``: an HMAC
  keyed with that key over the value, its path, the workflow and the step.  Without the
  key nobody can test a guess against it; a plain hash of a CVV or a card number could be
  reversed by enumerating every candidate;
- in the call's fingerprint (:meth:`~stepledger.domain.tools.Tool.fingerprint`: step
  identity, the plan check, approvals), the same marker: with the key, a call with another
  card has another fingerprint; without it, secret values take no part in it;
- in error texts and results, every string form of every secret value replaced by
  :data:`MARKER` (:class:`Scrubber`).

**Why the mark is salted with the workflow and the step, not the idempotency key.** A
fingerprint must be equal for every attempt of one call: a retry after a definite failure
runs under a new key and must still be the call a human approved.  A salt that changes
with the key would make the retry another call.  What the salt still gives: two steps, or
two workflows, with the same card record different marks, so the log does not link them;
only the attempts of one step share a mark, which is exactly what binding them needs.
What keeps a mark unguessable is the key, never the salt (a salt is in the log anyway):
without the key a candidate value cannot be tested, with it its holder can.

A path that cannot be followed (``payment.card`` where ``payment`` is a string) redacts the
whole value it stops at: redaction fails closed.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

MARKER = "[redacted]"
"""What stands in for a secret value when no redaction key is configured, and in texts."""
HMAC_PREFIX = "[redacted:hmac-sha256:"
"""The start of a keyed marker; 32 hex digits and ``]`` follow."""
MIN_KEY_LENGTH = 16
"""The shortest redaction key accepted: a short key could itself be guessed."""
_SHORT = 8
"""Secrets shorter than this are scrubbed from texts only where they stand alone."""
_SEGMENT = re.compile(r"^([A-Za-z0-9_\-]+)((?:\[\])*)$")
_DIGIT_GROUPS = re.compile(r"^\d(?:[ \-]?\d)*$")
_JSON_SEPARATORS = (",", ":")


class RedactionKey:
    """The operator's secret that keys secret markers; its value is never shown or recorded."""

    __slots__ = ("_key",)

    def __init__(self, key: str | bytes) -> None:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        if len(raw) < MIN_KEY_LENGTH:
            raise ValueError(f"a redaction key needs at least {MIN_KEY_LENGTH} bytes")
        self._key = raw

    def mark(self, *parts: str) -> str:
        """The keyed marker of a secret value: HMAC-SHA256 over the parts, 128 bits shown."""
        message = "\x1f".join(parts).encode()
        mac = hmac.new(self._key, message, hashlib.sha256).hexdigest()[:32]
        return f"{HMAC_PREFIX}{mac}]"

    def __repr__(self) -> str:
        return "RedactionKey(***)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RedactionKey) and hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(RedactionKey)


@dataclass
class _Node:
    """One level of the declared paths: whether the value here is secret, and what is below."""

    secret: bool = False
    fields: dict[str, _Node] = field(default_factory=dict)
    each: _Node | None = None
    """The node every list element follows (``name[]``)."""

    def below(self, key: object) -> _Node | None:
        return self.fields.get(str(key))


def path_problems(paths: Iterable[str]) -> list[str]:
    """Why the declared secret paths are invalid (an empty list when all are valid)."""
    invalid = sorted(repr(p) for p in paths if not isinstance(p, str) or not _valid_path(p))
    if not invalid:
        return []
    return [
        f"secret_args {', '.join(invalid)}: a secret path is names (letters, digits, '_', '-') "
        "joined by '.', each optionally followed by '[]' for every element of a list, "
        "e.g. 'card', 'payment.card' or 'cards[].number'"
    ]


def _valid_path(path: str) -> bool:
    return bool(path) and all(_SEGMENT.match(segment) for segment in path.split("."))


@functools.lru_cache(maxsize=1024)
def _tree(paths: frozenset[str]) -> _Node:
    root = _Node()
    for path in paths:
        node = root
        for segment in path.split("."):
            match = _SEGMENT.match(segment)
            assert match is not None, "paths are validated when the tool is defined"
            node = node.fields.setdefault(match.group(1), _Node())
            for _ in range(len(match.group(2)) // 2):
                node.each = node.each or _Node()
                node = node.each
        node.secret = True
    return root


Mark = Callable[[str, Any], Any]


def redact(arguments: Mapping[str, Any], paths: frozenset[str], mark: Mark) -> dict[str, Any]:
    """Return the arguments with the value at every secret path replaced by ``mark(where, v)``.

    ``where`` is the concrete path (``cards[1].number``).  Values a path cannot be followed
    into are replaced whole.
    """
    root = _tree(paths)
    return {k: _redact(v, root.below(k), mark, str(k)) for k, v in arguments.items()}


def _redact(value: Any, node: _Node | None, mark: Mark, where: str) -> Any:
    if node is None or value is None:
        return value
    if node.secret:
        return mark(where, value)
    if isinstance(value, Mapping) and node.fields:
        return {k: _redact(v, node.below(k), mark, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple) and node.each is not None:
        return [_redact(v, node.each, mark, f"{where}[{i}]") for i, v in enumerate(value)]
    return mark(where, value)  # the path cannot be followed: fail closed


def fixed_mark(where: str, value: Any) -> str:
    """The marker without a key: the same for every value, so it tells nothing."""
    return MARKER


def keyed_mark(key: RedactionKey, *salt: str) -> Mark:
    """A marker keyed by the operator's key and salted (by the workflow and the step)."""

    def mark(where: str, value: Any) -> str:
        return key.mark("stepledger.secret", *salt, where, _canonical(value))

    return mark


def secret_values(arguments: Mapping[str, Any], paths: frozenset[str]) -> list[Any]:
    """Every clear value at a secret path (nested secrets flattened to their leaves too)."""
    found: list[Any] = []

    def collect(where: str, value: Any) -> str:
        found.append(value)
        found.extend(_leaves(value))
        return MARKER

    redact(arguments, paths, collect)
    return found


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield v
            yield from _leaves(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield v
            yield from _leaves(v)


class Scrubber:
    """Replaces every string form of some secret values in texts and JSON-like values."""

    def __init__(self, values: Iterable[Any], mark: Callable[[str], str] | None = None) -> None:
        """``mark`` gives what stands in for a secret's form found in a text (the marker)."""
        forms: set[str] = set()
        for value in values:
            forms.update(_forms(value))
        patterns = sorted({_pattern(f) for f in forms}, key=len, reverse=True)
        self._regex = re.compile("|".join(patterns)) if patterns else None
        self._mark = mark

    def __bool__(self) -> bool:
        return self._regex is not None

    def text(self, text: str) -> str:
        """The text with every form of every secret replaced by its mark."""
        if self._regex is None:
            return text
        mark = self._mark
        if mark is None:
            return self._regex.sub(MARKER, text)
        return self._regex.sub(lambda found: mark(found.group(0)), text)

    def value(self, value: Any) -> Any:
        """A JSON-like value with secrets scrubbed from every string, key and equal number."""
        if self._regex is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        if isinstance(value, int | float) and any(map(self._regex.fullmatch, _forms(value))):
            return MARKER if self._mark is None else self._mark(str(value))
        if isinstance(value, bool | int | float) or value is None:
            return value
        return self.text(str(value))


def _forms(value: Any) -> set[str]:
    """The string forms a value takes when printed, quoted or serialised."""
    if value is None or isinstance(value, bool):
        return set()  # true/false cannot be hidden in a text; the marker hides it in the intent
    if isinstance(value, Mapping | list | tuple):
        return {_canonical(value)} if value else set()
    text = str(value)
    forms = {text, repr(value), json.dumps(value, default=str)}
    forms.add(json.dumps(value, ensure_ascii=False, default=str))
    if isinstance(value, str):
        forms.update({repr(value)[1:-1], json.dumps(value)[1:-1]})
    if isinstance(value, float) and value.is_integer():
        forms.add(str(int(value)))
    return {f for f in forms if f and f not in ('""', "''")}


def _pattern(form: str) -> str:
    if _DIGIT_GROUPS.match(form):
        digits = re.sub(r"[ \-]", "", form)
        # A card number is echoed grouped or ungrouped: match the digits whatever separates them.
        body = r"[ \-]?".join(digits)
        return body if len(digits) >= _SHORT else rf"(?<!\d){body}(?!\d)"
    body = re.escape(form)
    if len(form) >= _SHORT:
        return body
    # A short secret (a CVV, a PIN) inside a longer word or number is not that secret.
    return rf"(?<![A-Za-z0-9]){body}(?![A-Za-z0-9])"


def _canonical(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=_JSON_SEPARATORS, ensure_ascii=False, default=str
    )
