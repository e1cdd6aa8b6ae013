"""The agent processes: the plain SDK and the framework core, as an application runs them.

Three shapes, each one workflow per process (an actor):

- ``trip`` (the demo's saga): a read-only quote, a keyed charge that can be refunded, a keyed
  booking that can be cancelled, an unkeyed email; with ``cancel`` the customer cancels
  after booking and the saga is unwound (``wf.compensate``).
- ``paynotify``: a keyed capture that cannot be undone (the pivot), then an unkeyed receipt
  email: the commonest agent shape.
- ``framework``: :class:`~stepledger.integrations._core.AgentSteps` (the core every framework
  integration runs its tool calls through) driven by a scripted, offline model: a quote, a
  charge with a free-text memo, an optional payment needing approval, an email.  On a resume
  the model may word the memo and the email differently (``reword``) or pay with another
  card (``swap_card``), as a real model asked again may.

A run that ends waiting (a step in doubt, an approval pending) or on an error a retry may
cure (a record not acknowledged) is tried again later by the same process, as a supervisor
restarts a job; a bounded number of times.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any
from unittest import mock

from stepledger.errors import (
    ApprovalPendingError,
    StepCompensatedError,
    StepInDoubtError,
    StepLedgerError,
    WorkflowTakenOverError,
)
from stepledger.integrations._core import AgentSteps, ToolFailure
from stepledger.producer import Ledger, Workflow, fence
from stepledger_dev.simulate import services as sv
from stepledger_dev.simulate.plan import ActorSpec
from stepledger_dev.simulate.scheduler import Actor, Scheduler

#: How many times a process opens its workflow again after a run that ended waiting.
ROUNDS = 5
#: How long it waits before the next round (simulated seconds).
PAUSE_S = 1.5


def run_agent(actor: Actor, spec: ActorSpec, ledger: Ledger, sched: Scheduler) -> None:
    """Run the actor's workflow to its end, a few rounds at most."""
    shape = SHAPES[spec.kind]
    for _ in range(ROUNDS):
        try:
            actor.ended = shape(actor, spec, ledger)
            return
        except (StepInDoubtError, ApprovalPendingError) as exc:
            actor.notes["waiting"] = f"{type(exc).__name__}: {exc.message}"
        except WorkflowTakenOverError as exc:
            actor.ended = f"taken over: {exc.message}"
            return
        except ToolFailure as exc:
            actor.ended = f"tool failed: {exc.error}"
            return
        except StepLedgerError as exc:
            if not exc.retryable:
                actor.ended = f"{type(exc).__name__}: {exc.message}"
                return
            # A broker that did not acknowledge: the supervisor runs the job again later.
            actor.notes["waiting"] = f"{type(exc).__name__}: {exc.message}"
        sched.sleep(actor, PAUSE_S)
    actor.ended = f"gave up waiting: {actor.notes.get('waiting', '')}"


def _open(actor: Actor, ledger: Ledger, workflow_id: str, **kw: Any) -> Workflow:
    wf = ledger.workflow(workflow_id, **kw)
    actor.notes["workflow"] = wf
    return wf


def _ref(wf: Workflow, step: str) -> str:
    return f"{wf.workflow_id}/{step}"


def trip(actor: Actor, spec: ActorSpec, ledger: Ledger) -> str:
    """Quote, charge, book, (cancel or) email, finish."""
    tools = ledger.tools
    plan = [(s, tools.require(t)) for s, t in _TRIP]
    wf = _open(actor, ledger, spec.workflow, name="trip", plan=plan)
    if wf.finished:
        return f"finished before: {wf.state.status.value}"
    try:
        quote = wf.step("quote", tools.require(sv.QUOTE), trip=wf.workflow_id)
        charge = {"amount": quote["amount"], "currency": "EUR", "customer": wf.workflow_id}
        wf.step("charge", tools.require(sv.CHARGE), charge, ref=_ref(wf, "charge"))
        book = {"hotel": quote["hotel"], "nights": quote["nights"]}
        wf.step("book", tools.require(sv.BOOK), book, ref=_ref(wf, "book"))
        if "cancel" in spec.options:
            wf.compensate("the customer cancelled")
            return "compensated"
        email = {"to": f"{wf.workflow_id}@example.test", "body": quote["hotel"]}
        wf.step("email", tools.require(sv.EMAIL), email, ref=_ref(wf, "email"))
        wf.finish()
    except StepCompensatedError:
        # Recovery undid a step first in the log: the saga unwinds what else it can.
        wf.compensate("a step was undone by recovery")
        return "compensated"
    return "completed"


_TRIP = (("quote", sv.QUOTE), ("charge", sv.CHARGE), ("book", sv.BOOK), ("email", sv.EMAIL))


def paynotify(actor: Actor, spec: ActorSpec, ledger: Ledger) -> str:
    """Capture a payment (the pivot), then email the receipt."""
    tools = ledger.tools
    wf = _open(actor, ledger, spec.workflow, name="paynotify")
    if wf.finished:
        return f"finished before: {wf.state.status.value}"
    capture = {"amount": 40, "currency": "EUR", "customer": wf.workflow_id}
    wf.step("capture", tools.require(sv.CAPTURE), capture, ref=_ref(wf, "capture"))
    receipt = {"to": f"{wf.workflow_id}@example.test", "body": "receipt"}
    wf.step("email", tools.require(sv.EMAIL), receipt, ref=_ref(wf, "email"))
    wf.finish()
    return "completed"


def framework(actor: Actor, spec: ActorSpec, ledger: Ledger) -> str:
    """A scripted model's calls through the framework integrations' core."""
    tools = ledger.tools
    wf = _open(actor, ledger, spec.workflow, name="agent")
    if wf.finished:
        return f"finished before: {wf.state.status.value}"
    steps = AgentSteps(wf)
    again = wf.attempt > 1
    words = "Payment for trip" if again and "reword" in spec.options else "Trip payment"
    trip_id = wf.workflow_id
    quote = steps.call_sync(tools.require(sv.QUOTE), {"trip": trip_id})
    charge = {"amount": quote["amount"], "currency": "EUR", "customer": trip_id}
    memo = f"{words} {trip_id}"
    steps.call_sync(tools.require(sv.CHARGE), {**charge, "memo": memo, "ref": _ref(wf, "charge")})
    if "approval" in spec.options:
        swap = again and "swap_card" in spec.options
        card = "4111-0000-0000-0002" if swap else "4111-0000-0000-0001"
        pay = {"amount": 70, "currency": "EUR", "customer": trip_id, "card": card}
        pay["ref"] = _ref(wf, "pay")
        actor.notes["calling"] = pay  # what a person approving the payment is shown
        steps.call_sync(tools.require(sv.PAY), pay)
    email = {"to": f"{trip_id}@example.test", "body": f"{words} done", "ref": _ref(wf, "email")}
    steps.call_sync(tools.require(sv.EMAIL), email)
    wf.finish()
    return "completed"


SHAPES = {"trip": trip, "paynotify": paynotify, "framework": framework}


@contextlib.contextmanager
def runner_names(sched: Scheduler) -> Iterator[None]:
    """Runner identities named after their process, so a replay writes the same events.

    ``fence.new_runner`` is random (uuid4) by design; here each workflow handle's runner is
    ``<actor>~<n>``, and the event ids derived from it are the same in every replay.
    """
    made: Counter[str] = Counter()

    def new_runner() -> str:
        who = "-" if sched.current is None else sched.current.name
        made[who] += 1
        return f"{who}~{made[who]}"

    with mock.patch.object(fence, "new_runner", new_runner):
        yield
