"""The inbox's credentials and sessions (pure parts), and the CLI refusing a visible token."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stepledger.cli import cli
from stepledger.cli._identity import answerer, os_user
from stepledger.domain.approvals import AuthMethod
from stepledger.errors import ConfigError
from stepledger.inbox.auth import Credentials, Identity, Sessions, hash_token
from stepledger.inbox.users import User, load_users

ALICE = "alice-own-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_session_expires_can_be_revoked_and_is_never_the_token() -> None:
    clock = Clock()
    sessions = Sessions(ttl_s=60, clock=clock, limit=3)
    who = Identity("alice", AuthMethod.USERS_FILE)
    sid = sessions.open(who)
    assert len(sid) >= 40 and ALICE not in sid
    assert sessions.get(sid) == who
    clock.now += 59
    assert sessions.get(sid) == who
    clock.now += 2
    assert sessions.get(sid) is None  # expired, and forgotten
    other = sessions.open(who)
    assert sessions.revoke(other) and sessions.get(other) is None
    assert not sessions.revoke(other)
    assert sessions.get(None) is None and sessions.get("made-up") is None
    many = [sessions.open(who) for _ in range(5)]
    assert sessions.get(many[0]) is None and sessions.get(many[-1]) == who  # bounded


def test_credentials_prove_a_users_name_or_only_the_shared_token() -> None:
    creds = Credentials("shared-token-0123456789", {"alice": User(hash_token(ALICE))})
    assert creds.check(ALICE) == Identity("alice", AuthMethod.USERS_FILE)
    assert creds.check("shared-token-0123456789") == Identity("", AuthMethod.INBOX_TOKEN)
    for wrong in (None, "", "alice", ALICE + "x", hash_token(ALICE), "x" * 10_000):
        assert creds.check(wrong) is None
    assert (
        Credentials(None, {"alice": User(hash_token(ALICE))}).check("shared-token-0123456789")
        is None
    )
    with pytest.raises(ConfigError, match="needs a token or a users file"):
        Credentials(None, {})


def test_a_users_file_is_names_with_hashed_tokens_and_a_bad_one_is_one_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "users"
    path.write_text(f"# approvers\nalice {hash_token(ALICE)}\n\nbob smith {hash_token('b' * 20)}\n")
    assert load_users(path) == {
        "alice": User(hash_token(ALICE)),
        "bob smith": User(hash_token("b" * 20)),
    }
    for text, problem in (
        ("alice secret-in-clear\n", "expected 'NAME sha256:"),
        (f"alice {hash_token(ALICE)}\nalice {hash_token('x' * 20)}\n", "listed twice"),
        (f"{hash_token(ALICE)}\n", "expected 'NAME sha256:"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match=problem):
            load_users(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_users(tmp_path / "missing")


def test_inbox_user_adds_a_hashed_line_and_prints_the_token_once(tmp_path: Path) -> None:
    users = tmp_path / "users"
    runner = CliRunner()
    done = runner.invoke(cli, ["inbox-user", "carol", "--users", str(users)])
    assert done.exit_code == 0, done.output
    token = done.stdout.strip().split(": ", 1)[1]
    assert token not in users.read_text()
    assert Credentials(None, load_users(users)).check(token) == Identity(
        "carol", AuthMethod.USERS_FILE
    )
    again = runner.invoke(cli, ["inbox-user", "carol", "--users", str(users)])
    assert again.exit_code == 1 and "already in" in again.output


def test_the_token_on_the_command_line_is_refused_in_one_line(tmp_path: Path) -> None:
    done = CliRunner().invoke(cli, ["inbox", "--db", str(tmp_path / "x"), "--token", "t" * 20])
    assert done.exit_code == 2
    (line,) = [line for line in done.output.splitlines() if line.startswith("Error")]
    assert "STEPLEDGER_INBOX_TOKEN" in line and "--token-file" in line


def test_the_command_line_records_the_os_user_unless_told_otherwise() -> None:
    me = os_user()
    assert answerer(None) == (me, AuthMethod.OS_USER)
    assert answerer(me) == (me, AuthMethod.OS_USER)
    assert answerer(" someone-else ") == ("someone-else", AuthMethod.DECLARED)
