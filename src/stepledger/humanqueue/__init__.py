"""The human queue: escalations and approvals waiting for a person, and a person's answers.

One package for the queue's logic; the inbox (:mod:`stepledger.inbox`, a web page) and the
command line (``stepledger escalations``, ``approve``, ``deny``, ``approvals``, ``workflows``)
are two faces over it and hold no queue logic of their own.

- :mod:`~stepledger.humanqueue.escalations`: the open escalations read from the log, and a
  human's answer to one as an event.
- :mod:`~stepledger.humanqueue.queue`: the open cases, read from the projector's read-only
  snapshot (never a scan of the topic), filtered, counted and paged.
- :mod:`~stepledger.humanqueue.cases`: one case (an escalation or a pending approval) built
  from its workflow's events by the domain's own fold: steps, intent, recovery attempts,
  the decision that counted and any answer that came too late.
- :mod:`~stepledger.humanqueue.answers`: a person's answer, appended through the same
  functions for both faces, checked before and read back from the log after.
- :mod:`~stepledger.humanqueue.shown`: a call as a person is shown it (secrets redacted).
"""

from __future__ import annotations
