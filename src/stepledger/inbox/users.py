"""The inbox's users file: each person's token hash, fleets and role, one line each.

``NAME sha256:HEX fleets=A,B role=approver`` names a person, the SHA-256 of their own token
(``-``: no token, the trusted proxy names them) and their :class:`~stepledger.inbox.roles.Grant`.
A line without ``fleets=`` and ``role=`` (every line written before people were bound to
fleets) is an approver of every fleet, which is what it allowed then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stepledger.errors import ConfigError
from stepledger.inbox.roles import EVERY, EVERY_FLEET, Grant, InboxRole

HASH_PREFIX = "sha256:"


@dataclass(frozen=True)
class User:
    """One person of the users file: their token's hash and what they may do."""

    hashed: str | None
    """``sha256:HEX`` of their own token; None: named by the trusted proxy only (``-``)."""
    grant: Grant = EVERY_FLEET
    """Their fleets and role (a line without them: an approver of every fleet)."""


def load_users(path: Path) -> dict[str, User]:
    """A users file: ``NAME sha256:HEX [fleets=A,B|*] [role=approver|operator]`` per line.

    ``-`` instead of the hash lists a person the trusted proxy names, with no token of
    their own.  ``#`` starts a comment; ConfigError (naming the line) if a line is bad.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the users file {path}: {exc}") from None
    users: dict[str, User] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            name, user = _user_line(text)
        except ConfigError as exc:
            raise ConfigError(f"{path}:{number}: {exc.message}") from None
        if name in users:
            raise ConfigError(f"{path}:{number}: {name!r} is listed twice")
        users[name] = user
    return users


def user_line(name: str, hashed: str | None, grant: Grant) -> str:
    """A users file's line for ``name`` (what ``stepledger inbox-user`` appends)."""
    return f"{name} {hashed or '-'} {grant.fields()}"


def _user_line(text: str) -> tuple[str, User]:
    words = text.split()
    end = len(words)
    while end > 0 and "=" in words[end - 1]:  # the trailing key=value fields
        end -= 1
    name, hashed = " ".join(words[: end - 1]), words[end - 1] if end else ""
    digest = hashed.removeprefix(HASH_PREFIX)
    credential = hashed == "-" or (hashed.startswith(HASH_PREFIX) and len(digest) == 64)
    if not name or not credential:
        raise ConfigError(
            "expected 'NAME sha256:<64 hex digits>' (or '-' for a name only the proxy gives) "
            "then fleets=A,B and role=approver|operator"
        )
    if len(name) > 120 or not name.isprintable():
        raise ConfigError("a name is 1-120 printable characters")
    grant = parse_grant(words[end:])
    return name, User(None if hashed == "-" else HASH_PREFIX + digest.lower(), grant)


def a_fleet_id(name: str) -> bool:
    """True for a fleet id a users file can name (no space, comma or ``=``; 1-249 chars)."""
    return (
        0 < len(name) <= 249
        and name.isprintable()
        and not any(c.isspace() or c in ",=" for c in name)
        and name != EVERY
    )


def make_grant(fleets: Sequence[str] | None, role: str = InboxRole.APPROVER.value) -> Grant:
    """A grant from fleet names (None or ``["*"]``: every fleet) and a role's name."""
    try:
        chosen = InboxRole(role)
    except ValueError:
        raise ConfigError(f"unknown role {role!r}: approver or operator") from None
    if fleets is None or list(fleets) == [EVERY]:
        return Grant(None, chosen)
    bad = [name for name in fleets if not a_fleet_id(name)]
    if bad or not fleets:
        raise ConfigError(
            f"{bad[0] if bad else ''!r} is not a fleet id (fleets=A,B or fleets=*; "
            "no spaces, commas or '=')"
        )
    return Grant(frozenset(fleets), chosen)


def parse_grant(words: Sequence[str]) -> Grant:
    """The grant of a users-file line's ``key=value`` words; ConfigError if one is bad."""
    values: dict[str, str] = {}
    for word in words:
        key, _, value = word.partition("=")
        if key not in ("fleets", "role"):
            raise ConfigError(f"unknown field {key!r}: a line takes fleets=... and role=...")
        if key in values:
            raise ConfigError(f"{key}= is given twice")
        values[key] = value
    fleets = values.get("fleets")
    return make_grant(
        None if fleets is None else fleets.split(","), values.get("role", InboxRole.APPROVER)
    )
