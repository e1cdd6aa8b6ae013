"""The human inbox: one local web page for every escalation and approval, across workflows.

A face over the human queue (:mod:`stepledger.humanqueue`), like the command line:
:mod:`~stepledger.inbox.app` and :mod:`~stepledger.inbox.server` are the Starlette
application (session, CSRF, templates) and its uvicorn server on 127.0.0.1;
:mod:`~stepledger.inbox.auth` the credentials, sessions and approvers;
:mod:`~stepledger.inbox.users` the users file; :mod:`~stepledger.inbox.roles` a person's
fleets and role and :mod:`~stepledger.inbox.access` the one check every endpoint makes of
them; :mod:`~stepledger.inbox.formats` how templates show values;
:mod:`~stepledger.inbox.filters` the page's query parameters; :mod:`~stepledger.inbox.timeline`
a case's timeline picture.
"""

from __future__ import annotations
