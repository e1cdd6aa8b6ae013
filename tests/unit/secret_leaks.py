"""Secret values for leak tests, a search for every form of them, and a brute-force attacker."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from stepledger.domain.ids import canonical_json
from stepledger.domain.tools import Tool

CARD = "4111111111111111"
"""A card-number-like secret (top level)."""
CVV = "737"
"""A CVV-like secret (top level)."""
NESTED_CARD = "5500005555555559"
"""A card number at ``payment.card``."""
NESTED_CVV = "0412"
"""A 4-digit CVV at ``payment.cvv``."""
LISTED_CARD = "378282246310005"
"""A card number at ``cards[].number``."""
NOTE = "order-note-q7x"
"""A non-secret argument: it must be found, so the search is shown to see the data."""
PATHS = frozenset({"card", "cvv", "payment.card", "payment.cvv", "cards[].number"})
ARGS: dict[str, Any] = {
    "amount": 1250,
    "card": CARD,
    "cvv": CVV,
    "note": NOTE,
    "payment": {"card": NESTED_CARD, "cvv": NESTED_CVV, "currency": "EUR"},
    "cards": [{"number": LISTED_CARD, "label": "amex"}],
}
SECRETS = (CARD, CVV, NESTED_CARD, NESTED_CVV, LISTED_CARD)


def _pattern(secret: str) -> bytes:
    # Digits in any grouping (4111 1111 ..., 4111-1111-...), not inside a longer number nor a
    # hex id: runner and event ids are random hex, and "737" turns up in one now and then.
    return rb"(?<![0-9a-fA-F])" + rb"[ \-]?".join(d.encode() for d in secret) + rb"(?![0-9a-fA-F])"


_LEAK = re.compile(b"|".join(_pattern(s) for s in SECRETS))


def leaks(data: bytes | str, *, ignore: Iterable[str] = ()) -> list[str]:
    """Every clear secret found in the data (``ignore``: random names such as topics)."""
    raw = data.encode() if isinstance(data, str) else data
    for name in ignore:
        raw = raw.replace(name.encode(), b"")
    return sorted({m.group().decode(errors="replace") for m in _LEAK.finditer(raw)})


CVV_CANDIDATES = [f"{n:03d}" for n in range(1000)] + [f"{n:04d}" for n in range(10_000)]
_HEX = re.compile(r"[0-9a-f]{16,}")


def crack(recorded: Iterable[str], arguments: Mapping[str, Any], path: str) -> set[str]:
    """Every CVV candidate some hash in the recorded texts confirms (the attack must fail).

    The attacker knows everything recorded (including the other arguments, the idempotency
    key and every id) but not the operator's redaction key.  For each 3-4 digit candidate
    it tries the constructions a recorder could have used: a plain or salted SHA-256 of
    the value, an HMAC keyed with any recorded id or key, and the SHA-256 of the canonical
    arguments with the candidate put in place of the secret.
    """
    texts = list(recorded)
    found = {h[:16] for text in texts for h in _HEX.findall(text)}
    salts = {s for text in texts for s in _ids(text)} | {""}
    return {c for c in CVV_CANDIDATES if found.intersection(_guesses(c, arguments, path, salts))}


def _guesses(candidate: str, arguments: Mapping[str, Any], path: str, salts: set[str]) -> set[str]:
    out = {
        hashlib.sha256(canonical_json(_put(arguments, path, candidate)).encode()).hexdigest(),
        hashlib.sha256(candidate.encode()).hexdigest(),
    }
    for salt in salts:
        out.add(hashlib.sha256(f"{salt}\x1f{candidate}".encode()).hexdigest())
        out.add(hashlib.sha256(f"{salt}{candidate}".encode()).hexdigest())
        out.add(hmac.new(salt.encode(), candidate.encode(), hashlib.sha256).hexdigest())
    return {g[:16] for g in out}


def _put(arguments: Mapping[str, Any], path: str, value: str) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(arguments))
    *parents, leaf = path.split(".")
    node = copy
    for name in parents:
        node = node[name]
    node[leaf] = value
    return copy


def _ids(text: str) -> Iterator[str]:
    """The ids and keys in a recorded text: what a recorder would have salted with."""
    try:
        value = json.loads(text)
    except ValueError:
        return
    yield from _walk(value)


def _walk(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(v, str) and str(k).endswith(("_id", "_key")):
                yield v
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    elif isinstance(value, str) and value[:1] in ("{", "["):
        yield from _ids(value)


def secret_tool(**kw: Any) -> Tool:
    """A keyed charge with every kind of secret path, resolved by query (no re-drive)."""
    kw.setdefault("query", lambda key, args: None)
    return Tool(
        name="charge_card",
        effect="idempotent",
        keyed=True,
        policy="query",
        secret_args=PATHS,
        **kw,
    )
