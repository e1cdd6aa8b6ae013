"""The timeline picture on a case page, built from the case's fold (see stepledger.timeline)."""

from __future__ import annotations

from dataclasses import replace

from markupsafe import Markup

from stepledger.domain.factory import utc_now
from stepledger.humanqueue.cases import Case
from stepledger.timeline import Mark, bars, timeline_svg


def case_timeline(case: Case) -> Markup:
    """The case's workflow as inline SVG; the step the case asks about waits while it is open."""
    rows = [
        replace(b, escalated=True) if case.is_open and b.step_id == case.step_id else b
        for b in bars(case.steps)
    ]
    marks = [Mark(p.at, f"recovery {p.policy} (try {p.attempt})") for p in case.probes]
    marks += [Mark(d.at, f"{d.answer.value} by {d.by}") for d in case.decisions]
    title = f"{case.workflow_id}: {case.workflow_status}, attempt {case.workflow_attempt}"
    # The SVG escapes every label itself (markup and control characters).
    return Markup(timeline_svg(title, rows, now=utc_now(), marks=marks))
