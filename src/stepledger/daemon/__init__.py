"""What every stepledger daemon process shares.

- :mod:`~stepledger.daemon.process`: JSON logs and graceful signals;
- :mod:`~stepledger.daemon.health`: the ``/healthz`` and ``/readyz`` probes (and ``/metrics``).

The client id a daemon shows the broker is a name on the wire: :func:`stepledger.wire.client_id`.
"""
