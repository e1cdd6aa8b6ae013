"""Who may do what in the inbox: a person's fleets and role, and the one check of both.

A person of the inbox holds a :class:`Grant`: the fleets they answer for (a named set, or
every fleet the inbox serves) and a role:

- **approver**: sees their fleets' cases and answers escalations and approvals;
- **operator**: an approver who may also use a workflow's controls.

The check is pure data: :meth:`Grant.refusal` says in one line why an action on a fleet's
case is refused (None: allowed), so every endpoint asks the same question the same way
(:mod:`stepledger.inbox.access` turns the answer into a 403).  The users file
(:mod:`stepledger.inbox.users`) carries each person's grant.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

EVERY = "*"
"""``fleets=*``: every fleet the inbox serves."""


class InboxRole(StrEnum):
    """What a person may do beyond seeing their fleets' cases."""

    APPROVER = "approver"
    OPERATOR = "operator"


class Action(StrEnum):
    """What a request asks to do with a case (or a workflow) of one fleet."""

    SEE = "see"
    """List it, count it, open its page."""
    ANSWER = "answer"
    """Answer an escalation or an approval."""
    CONTROL = "control"
    """Use a workflow's controls (operators only)."""


#: The roles that may take each action.
_ALLOWED: dict[Action, frozenset[InboxRole]] = {
    Action.SEE: frozenset(InboxRole),
    Action.ANSWER: frozenset(InboxRole),
    Action.CONTROL: frozenset({InboxRole.OPERATOR}),
}


@dataclass(frozen=True)
class Grant:
    """The fleets a person acts for and their role."""

    fleets: frozenset[str] | None = None
    """The fleets whose cases they see and act on; None: every fleet the inbox serves."""
    role: InboxRole = InboxRole.APPROVER
    """What they may do with those cases."""

    def covers(self, fleet: str) -> bool:
        """True when ``fleet``'s cases are this person's."""
        return self.fleets is None or fleet in self.fleets

    def may(self, action: Action) -> bool:
        """True when the role allows ``action`` (on any of the grant's fleets)."""
        return self.role in _ALLOWED[action]

    def refusal(self, action: Action, fleet: str | None = None) -> str | None:
        """Why ``action`` on a case of ``fleet`` is refused, in one line (None: allowed).

        ``fleet`` None asks about the role only.  The line never names the other fleet:
        a person learns that a case is not theirs, not whose it is.
        """
        if not self.may(action):
            return f"an {self.role.value} may not {action.value}: that takes an operator"
        if fleet is not None and not self.covers(fleet):
            return f"this case is not of your fleets ({self.describe_fleets()})"
        return None

    def within(self, serves: frozenset[str] | None) -> Grant:
        """This grant narrowed to the fleets an inbox serves (None: it serves every fleet)."""
        if serves is None:
            return self
        return Grant(serves if self.fleets is None else self.fleets & serves, self.role)

    def describe_fleets(self) -> str:
        """The fleets as a person reads them."""
        if self.fleets is None:
            return "every fleet"
        return ", ".join(sorted(self.fleets)) or "none on this inbox"

    def describe(self) -> str:
        """One phrase: ``approver of fleets a, b`` or ``operator of every fleet``."""
        fleets = self.describe_fleets()
        return f"{self.role.value} of {fleets if self.fleets is None else 'fleets ' + fleets}"

    def fields(self) -> str:
        """The grant as a users-file line carries it (``fleets=a,b role=approver``)."""
        fleets = EVERY if self.fleets is None else ",".join(sorted(self.fleets))
        return f"fleets={fleets} role={self.role.value}"


EVERY_FLEET = Grant()
"""An approver of every fleet: a line without fleets, the shared token, a proxy without users."""
