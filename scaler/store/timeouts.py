"""How long a store waits: for a lock, for another process's upgrade, for a server.

Given to :func:`scalewatch.store.engine.open_store` (and ``make_engine``) by whoever opens a
store; the defaults are the product's, a test passes shorter or longer ones.

>>> Timeouts().busy_ms, Timeouts(ping_idle_s=0.0).ping_idle_s
(30000, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULTS", "Timeouts"]


@dataclass(frozen=True, kw_only=True)
class Timeouts:
    # SQLite: how long a statement waits for another connection's lock before "locked".
    busy_ms: int = 30_000
    # How long opening a store waits for another process's upgrade (beyond busy_ms).
    migration_wait_s: float = 900.0
    # PostgreSQL: seconds a new connection waits for the server before it gives up.
    connect_s: float = 10.0
    # PostgreSQL: a pooled connection idle this long is pinged before use (a server
    # restart leaves dead ones behind); one back in use sooner is not: under load every
    # trip counts.
    ping_idle_s: float = 1.0


DEFAULTS = Timeouts()  # the product's
