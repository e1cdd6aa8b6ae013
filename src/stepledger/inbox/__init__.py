"""The human inbox: one local web page for every escalation and approval, across workflows.

- :mod:`~stepledger.inbox.queue`: the open cases, read from the projector's read-only
  snapshot (never a scan of the topic), filtered, counted and paged.
- :mod:`~stepledger.inbox.cases`: one case (an escalation or a pending approval) built
  from its workflow's events by the domain's own fold: steps, intent, recovery attempts,
  the decision that counted and any answer that came too late.
- :mod:`~stepledger.inbox.answers`: a person's answer, appended through the same
  functions the CLI uses, checked before and read back from the log after.
- :mod:`~stepledger.inbox.app` and :mod:`~stepledger.inbox.server`: the Starlette
  application (token, CSRF, templates) and its uvicorn server on 127.0.0.1.

Only ``app`` and ``server`` import the web framework; the rest is plain library code.
"""

from __future__ import annotations
