"""Who answers from the command line: the operating-system user, unless ``--by`` says otherwise."""

from __future__ import annotations

import os
import pwd

from stepledger.domain.approvals import AuthMethod

BY_HELP = "Who answers (default: your operating-system user; another name is recorded as declared)."


def os_user() -> str:
    """The name of the user this process runs as (from the uid, not from the environment)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def answerer(by: str | None) -> tuple[str, AuthMethod]:
    """The name an answer records and how it was established."""
    user = os_user()
    if by is None or not by.strip() or by.strip() == user:
        return user, AuthMethod.OS_USER
    return by.strip(), AuthMethod.DECLARED
