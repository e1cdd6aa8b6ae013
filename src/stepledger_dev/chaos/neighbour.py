"""A second deployment on the same cluster (``stepledger chaos --two-deployments``).

Up to 0.3.0 two step logs on one cluster shared one checkpoint topic, recovery changelog,
dead-letter topic and groups by default (issue 42): one log's checkpointer started from
the other's progress, and a projector restored the other log's workflows.  This fault runs
a whole second deployment beside the first, on the first one's broker: its own step log
(every other name its default, derived from the log's), its own tool services, projector,
recovery daemon and checkpointer, and agents running the same plan, same workflow ids and
same crash points, at the same time.  Each deployment is judged by every invariant on its
own log and its own services' effects, and both together by :func:`isolation`: no state
topic or group shared, every record of each state topic naming its own log, and no
daemon that refused another log's record (it would have been offered one).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from stepledger.checkpoints.statetopics import origins
from stepledger.config import Settings
from stepledger.errors import BrokerError
from stepledger.kafka.logid import resolve
from stepledger.kafka.topics import topic_exists
from stepledger_dev.chaos.invariants import InvariantViolation
from stepledger_dev.chaos.plan import ChaosPlan
from stepledger_dev.stack import LocalStack, StackOptions

#: The test-only build whose second deployment shares the first one's state topics.
SHARED_STATE_BREAK = "shared-state"
#: Names every daemon's log line about a record of another step log carries.
REFUSED_LINE = "names another step log"
#: The settings that name a deployment's state (each must differ between the two).
STATE_NAMES = ("dlq_topic", "checkpoint_topic", "recovery_state_topic")
GROUP_NAMES = ("projector_group", "recovery_group")


def neighbour_stack_options(
    options: StackOptions,
    bootstrap: str,
    share_with: Settings | None = None,
    admin: Mapping[str, str] | None = None,
) -> StackOptions:
    """The second deployment's stack: the first one's broker, everything else its own.

    ``share_with`` (the ``--break shared-state`` build the harness must catch): the first
    deployment's checkpoint topic and recovery changelog, as 0.3.0's defaults gave both.
    """
    shared: tuple[tuple[str, str], ...] = ()
    if share_with is not None:
        shared = (
            ("checkpoint_topic", share_with.checkpoint_topic),
            ("recovery_state_topic", share_with.recovery_state_topic),
        )
    return dataclasses.replace(
        options,
        bootstrap=bootstrap,
        durable_broker=False,
        topic_prefix=f"{options.topic_prefix}-neighbour",
        names=shared,
        # On a secured cluster the neighbour is a fleet of its own, made with the super
        # user's settings the first deployment holds.
        kafka=tuple((admin or {}).items()),
    )


class Beside:
    """The second deployment's run, in a thread beside the first one's."""

    def __init__(
        self,
        workdir: Path,
        stack_options: StackOptions,
        execute: Callable[[LocalStack], list[InvariantViolation]],
        echo: Callable[[str], None],
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.stack = LocalStack(workdir, stack_options)
        self._execute = execute
        self._echo = echo
        self.violations: list[InvariantViolation] = []
        self._thread = threading.Thread(target=self._run, name="neighbour", daemon=True)

    def start(self) -> Beside:
        """Start its stack (services, topics) here, then its rounds in the thread."""
        self.stack.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.violations = self._execute(self.stack)
        except Exception as exc:  # reported, never lost with the thread
            self.violations = [InvariantViolation("neighbour_ran", None, repr(exc))]

    def finish(self, timeout: float) -> list[InvariantViolation]:
        """Wait for its run (bounded); its violations, each named as the neighbour's."""
        self._thread.join(timeout)
        found = list(self.violations)
        if self._thread.is_alive():
            found.append(InvariantViolation("neighbour_ran", None, "still running at the end"))
        return [dataclasses.replace(v, invariant=f"neighbour:{v.invariant}") for v in found]

    def stop(self) -> None:
        """Stop every process of the second deployment."""
        self.stack.stop()


def isolation(first: LocalStack, second: LocalStack) -> list[InvariantViolation]:
    """The two deployments shared no state: names, records and daemons' reads."""
    found = _names(first.settings, second.settings)
    for stack in (first, second):
        found += _records(stack.settings)
        found += _refusals(stack)
    return found


def _names(a: Settings, b: Settings) -> list[InvariantViolation]:
    return [
        InvariantViolation("no_state_name_shared", None, f"{name}: {getattr(a, name)}")
        for name in (*STATE_NAMES, *GROUP_NAMES)
        if getattr(a, name) == getattr(b, name)
    ]


def _records(settings: Settings) -> list[InvariantViolation]:
    """Every record of the deployment's state topics names its own step log."""
    found = []
    try:
        own = str(resolve(settings))
        for topic in (settings.checkpoint_topic, settings.recovery_state_topic):
            if not topic_exists(settings, topic):
                continue
            named = origins(settings, topic, last=None)
            others = {n: c for n, c in named.items() if n != own}
            if others or not named:
                detail = f"{topic}: {dict(named)} (own: {own})"
                found.append(InvariantViolation("state_records_name_their_log", None, detail))
    except BrokerError as exc:
        found.append(InvariantViolation("state_records_name_their_log", None, exc.message))
    return found


def _refusals(stack: LocalStack) -> list[InvariantViolation]:
    """No daemon of the deployment was offered another log's state record."""
    found = []
    for proc in stack.procs.values():
        text = proc.log_path.read_text() if proc.log_path.exists() else ""
        if REFUSED_LINE in text:
            line = next(x for x in text.splitlines() if REFUSED_LINE in x)
            found.append(InvariantViolation("no_foreign_state_read", None, line[:300]))
    return found


def same_plan(plan: ChaosPlan) -> ChaosPlan:
    """The plan the second deployment runs: the same workflows and crash points, without
    the broker's faults (the broker is the first deployment's)."""
    infra = tuple(f for f in plan.infra if not f.point.value.startswith("broker:"))
    return dataclasses.replace(plan, infra=infra)
