"""What every stepledger daemon process shares.

- :mod:`~stepledger.daemon.process`: JSON logs and graceful signals;
- :mod:`~stepledger.daemon.health`: the ``/healthz`` and ``/readyz`` probes (and ``/metrics``);
- :mod:`~stepledger.daemon.clientid`: the client id it shows the broker (role and version).
"""
