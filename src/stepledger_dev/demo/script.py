"""The demo's cast: four trip workflows and where the agent process dies in each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Trip:
    """One trip workflow (quote -> charge -> book -> email) and its crash point, if any."""

    workflow_id: str
    step: str | None
    """The step the agent dies in (None: the trip runs to its end)."""
    point: str | None
    """``after_intent`` or ``after_effect`` (see ``stepledger_dev.examples.trip_agent``)."""
    story: str
    """What the crash leaves behind, in words."""

    @property
    def target(self) -> str:
        """The trip agent's argument: ``WORKFLOW[@STEP:POINT]``."""
        return (
            self.workflow_id
            if self.step is None
            else f"{self.workflow_id}@{self.step}:{self.point}"
        )


TRIPS: tuple[Trip, ...] = (
    Trip("trip-1", None, None, "runs to the end before the crash"),
    Trip(
        "trip-2",
        "charge",
        "after_effect",
        "dies after payments charged the card, before the outcome was recorded",
    ),
    Trip(
        "trip-3",
        "book",
        "after_effect",
        "dies after the hotel was booked, before the outcome was recorded",
    ),
    Trip(
        "trip-4",
        "email",
        "after_intent",
        "dies after the email's intent, before it was sent (irreversible, no key)",
    ),
)


def killed(trips: tuple[Trip, ...] = TRIPS) -> dict[str, str]:
    """The trips that die mid-step, with the step each dies in."""
    return {t.workflow_id: t.step for t in trips if t.step is not None}
