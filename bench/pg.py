"""The peer bench's PostgreSQL: the development stack's throwaway server
(:mod:`stepledger_dev.postgres`), named as the bench has always imported it."""

from __future__ import annotations

from stepledger_dev.postgres import free_port, postgres_cluster, postgres_missing

__all__ = ["free_port", "postgres_cluster", "postgres_missing"]
