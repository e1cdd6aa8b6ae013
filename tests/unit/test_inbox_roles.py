"""People bound to fleets and roles: the one check, the users file that carries it, the 403."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from stepledger.cli import cli
from stepledger.domain.approvals import AuthMethod
from stepledger.errors import ConfigError
from stepledger.humanqueue.queue import QueueFilter
from stepledger.inbox import access
from stepledger.inbox.auth import IDENTITY_KEY, SHARED, Credentials, Identity, hash_token
from stepledger.inbox.roles import EVERY_FLEET, Action, Grant, InboxRole
from stepledger.inbox.users import User, load_users, make_grant, user_line

A = frozenset({"fleet-a"})
APPROVER_A = Grant(A, InboxRole.APPROVER)
OPERATOR_A = Grant(A, InboxRole.OPERATOR)


@pytest.mark.parametrize(
    ("grant", "action", "fleet", "allowed"),
    [
        (APPROVER_A, Action.SEE, "fleet-a", True),
        (APPROVER_A, Action.ANSWER, "fleet-a", True),
        (APPROVER_A, Action.SEE, "fleet-b", False),
        (APPROVER_A, Action.ANSWER, "fleet-b", False),
        (APPROVER_A, Action.ANSWER, "", False),  # a case with no fleet is nobody's named fleet
        (APPROVER_A, Action.CONTROL, "fleet-a", False),
        (APPROVER_A, Action.CONTROL, None, False),
        (OPERATOR_A, Action.CONTROL, "fleet-a", True),
        (OPERATOR_A, Action.ANSWER, "fleet-a", True),
        (OPERATOR_A, Action.CONTROL, "fleet-b", False),
        (OPERATOR_A, Action.CONTROL, None, True),
        (EVERY_FLEET, Action.ANSWER, "any-fleet", True),
        (EVERY_FLEET, Action.CONTROL, "any-fleet", False),  # old lines: approvers, not operators
        (Grant(None, InboxRole.OPERATOR), Action.CONTROL, "any-fleet", True),
    ],
)
def test_a_grant_allows_its_roles_actions_on_its_fleets_only(
    grant: Grant, action: Action, fleet: str | None, allowed: bool
) -> None:
    reason = grant.refusal(action, fleet)
    assert (reason is None) is allowed
    if reason is not None:
        assert "\n" not in reason
        assert "fleet-b" not in reason  # a person learns the case is not theirs, not whose


def test_a_refusal_says_which_fleets_are_yours_or_that_it_takes_an_operator() -> None:
    two = Grant(frozenset({"fb", "fa"}), InboxRole.APPROVER)
    assert two.refusal(Action.ANSWER, "fc") == "this case is not of your fleets (fa, fb)"
    assert two.refusal(Action.CONTROL, "fa") == (
        "an approver may not control: that takes an operator"
    )
    assert two.describe() == "approver of fleets fa, fb"
    assert EVERY_FLEET.describe() == "approver of every fleet"


def test_a_grant_is_narrowed_to_the_fleets_an_inbox_serves() -> None:
    ab = Grant(frozenset({"fa", "fb"}), InboxRole.OPERATOR)
    assert ab.within(None) == ab
    assert ab.within(frozenset({"fa"})) == Grant(frozenset({"fa"}), InboxRole.OPERATOR)
    assert EVERY_FLEET.within(frozenset({"fa"})) == Grant(frozenset({"fa"}))
    nothing = APPROVER_A.within(frozenset({"fb"}))
    assert nothing.fleets == frozenset() and not nothing.covers("fb")
    assert (
        nothing.refusal(Action.SEE, "fb") == "this case is not of your fleets (none on this inbox)"
    )


def test_a_users_file_line_carries_fleets_and_role_and_an_old_line_means_every_fleet(
    tmp_path: Path,
) -> None:
    path = tmp_path / "users"
    ana, bob = hash_token("a" * 20), hash_token("b" * 20)
    path.write_text(
        f"old timer {ana}\n"
        f"bob {bob} fleets=fa,fb role=operator\n"
        f"carol {hash_token('c' * 20)} role=approver fleets=fc\n"
        f"dan {hash_token('d' * 20)} fleets=*\n"
        "erin - fleets=fa\n"
    )
    users = load_users(path)
    assert users["old timer"] == User(ana, EVERY_FLEET)
    assert users["bob"] == User(bob, Grant(frozenset({"fa", "fb"}), InboxRole.OPERATOR))
    assert users["carol"].grant == Grant(frozenset({"fc"}), InboxRole.APPROVER)
    assert users["dan"].grant == EVERY_FLEET
    assert users["erin"] == User(None, Grant(frozenset({"fa"})))
    for name, user in users.items():  # what inbox-user writes reads back the same
        path.write_text(user_line(name, user.hashed, user.grant) + "\n")
        assert load_users(path) == {name: user}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("bob {h} fleets=fa role=boss", "unknown role 'boss'"),
        ("bob {h} fleets=", "is not a fleet id"),
        ("bob {h} fleets=fa,,fb", "is not a fleet id"),
        ("bob {h} fleets=fa fleets=fb", "fleets= is given twice"),
        ("bob {h} team=fa", "unknown field 'team'"),
        ("bob fleets=fa", "expected 'NAME sha256:"),
        ("{h} fleets=fa", "expected 'NAME sha256:"),
        ("bob secret fleets=fa", "expected 'NAME sha256:"),
    ],
)
def test_a_bad_grant_is_one_message_naming_the_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "users"
    path.write_text("# people\n" + line.format(h=hash_token("b" * 20)) + "\n")
    with pytest.raises(ConfigError, match=problem) as caught:
        load_users(path)
    assert caught.value.message.startswith(f"{path}:2: ")


def test_a_token_proves_its_persons_grant_and_a_proxy_only_line_no_token() -> None:
    users = {
        "bob": User(hash_token("bob-own-token-0123456"), OPERATOR_A),
        "erin": User(None, APPROVER_A),
    }
    creds = Credentials("shared-token-0123456789", users)
    assert creds.check("bob-own-token-0123456") == Identity(
        "bob", AuthMethod.USERS_FILE, OPERATOR_A
    )
    assert creds.check("shared-token-0123456789") == SHARED
    assert SHARED.grant == EVERY_FLEET
    for guess in ("-", "", "None", "erin"):
        assert creds.check(guess) is None
    with pytest.raises(ConfigError, match="needs a token or a users file with people's tokens"):
        Credentials(None, {"erin": User(None, APPROVER_A)})  # nobody could open it


def test_the_queue_filter_lists_and_counts_only_the_persons_fleets() -> None:
    where, params = QueueFilter(fleets=frozenset({"fb", "fa"})).where()
    assert "list_contains(?, fleet_id)" in where and params == [["fa", "fb"]]
    assert QueueFilter(fleets=frozenset()).where() == ("FALSE", [])
    assert QueueFilter().where() == ("TRUE", [])


def _request(identity: Identity | None, method: str = "POST") -> Request:
    scope: dict[str, object] = {
        "type": "http",
        "method": method,
        "path": "/",
        "headers": [],
        "query_string": b"",
    }
    if identity is not None:
        scope[IDENTITY_KEY] = identity
    return Request(scope)


def test_requires_refuses_a_role_before_the_endpoint_runs_with_one_line_403() -> None:
    ran: list[str] = []

    class Pages:
        @access.requires(Action.CONTROL)
        async def pause(self, request: Request) -> Response:
            ran.append("pause")
            return PlainTextResponse("paused")

    alice = Identity("alice", AuthMethod.USERS_FILE, APPROVER_A)
    refused = asyncio.run(Pages().pause(_request(alice)))
    assert refused.status_code == 403 and ran == []
    assert bytes(refused.body).decode() == (
        "403: alice: an approver may not control: that takes an operator"
    )
    refused = asyncio.run(Pages().pause(_request(None)))  # the shared token is no operator
    assert refused.status_code == 403 and ran == []
    bob = Identity("bob", AuthMethod.USERS_FILE, OPERATOR_A)
    assert asyncio.run(Pages().pause(_request(bob))).status_code == 200 and ran == ["pause"]


def test_refused_checks_the_cases_fleet() -> None:
    alice = _request(Identity("alice", AuthMethod.PROXY_HEADER, APPROVER_A))
    assert access.refused(alice, Action.ANSWER, "fleet-a") is None
    other = access.refused(alice, Action.ANSWER, "fleet-b")
    assert other is not None and other.status_code == 403
    assert bytes(other.body).decode() == ("403: alice: this case is not of your fleets (fleet-a)")


def test_inbox_user_writes_fleets_and_role_and_refuses_a_bad_fleet(tmp_path: Path) -> None:
    users = tmp_path / "users"
    runner = CliRunner()
    done = runner.invoke(
        cli,
        ["inbox-user", "ann", "--users", str(users), "--fleet", "fa", "--fleet", "fb",
         "--role", "operator"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    token = done.stdout.strip().split(": ", 1)[1]
    assert "operator of fleets fa, fb" in done.stderr
    who = Credentials(None, load_users(users)).check(token)
    assert who is not None and who.grant == Grant(frozenset({"fa", "fb"}), InboxRole.OPERATOR)
    proxied = runner.invoke(cli, ["inbox-user", "pat", "--users", str(users), "--proxy-only"])
    assert proxied.exit_code == 0 and proxied.stdout == ""
    assert load_users(users)["pat"] == User(None, EVERY_FLEET)
    bad = runner.invoke(cli, ["inbox-user", "cy", "--users", str(users), "--fleet", "a,b"])
    assert bad.exit_code == 1 and "is not a fleet id" in bad.output
    assert "cy" not in load_users(users)
    assert make_grant(["*"]) == EVERY_FLEET
