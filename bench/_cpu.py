"""Where a benchmark's CPU went, by component: every process on the machine sampled from
``/proc`` while it runs, and, on PostgreSQL, what its backends were busy with.

A :class:`CpuSplit` samples each process's user + system CPU seconds every ``period``
seconds in a thread; a process born or gone in between counts from zero or to its last
sample (a short-lived one loses at most a period of its tail). :meth:`CpuSplit.cores`
gives, by component, the CPU it used over the window divided by the window's length: 1.0
is a whole core. A :class:`QuerySampler` counts the active queries in
``pg_stat_activity`` each period (by their first words), so the PostgreSQL share can be
split by what the backends ran.

>>> shares({"insert into steps": 3, "select x": 1})
[('insert into steps', 0.75), ('select x', 0.25)]
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

TICK = os.sysconf("SC_CLK_TCK")

__all__ = ["CpuSplit", "Process", "QuerySampler", "Statements", "dsn", "postmaster", "shares"]


class Process(NamedTuple):
    name: str  # the command's
    cpu: float  # seconds so far
    parent: int  # its parent's pid


def _processes() -> dict[int, Process]:
    """Every process now, by pid."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone since the listing
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        out[int(entry.name)] = Process(name, cpu, int(fields[1]))
    return out


class CpuSplit:
    """CPU seconds by component over a window. ``component(pid, process)`` names the
    component of a process (``None``: "other")."""

    def __init__(
        self, component: Callable[[int, Process], str | None], period: float = 0.5
    ) -> None:
        self.component, self.period = component, period
        self.first: dict[int, float] = {}
        self.last: dict[int, Process] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.began = self.ended = 0.0

    def start(self) -> CpuSplit:
        self.began = time.monotonic()
        self.first = {pid: process.cpu for pid, process in _processes().items()}
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()
        self.last.update(_processes())
        self.ended = time.monotonic()

    def _sample(self) -> None:
        while not self.stop.wait(self.period):
            self.last.update(_processes())

    def cores(self) -> dict[str, float]:
        """By component, its CPU seconds over the window's seconds, largest first."""
        used: Counter[str] = Counter()
        for pid, process in self.last.items():
            spent = process.cpu - self.first.get(pid, 0.0)
            if spent > 0:
                used[self.component(pid, process) or "other"] += spent
        window = max(1e-9, self.ended - self.began)
        return {name: seconds / window for name, seconds in used.most_common()}


_WORDS = re.compile(r"\s+")


def _gist(query: str) -> str:
    """A query's first words, lower case: enough to tell an insert from a chart read."""
    words = _WORDS.sub(" ", query).strip().lower()
    return words[:60]


class QuerySampler:
    """The active queries of a PostgreSQL server, counted by gist (and what each waits for,
    if anything) every ``period`` s, and
    the sessions (connections) opened to its database meanwhile: each one a new backend
    process, forked and set up, which costs the server more than most queries."""

    def __init__(self, url: str, period: float = 0.1) -> None:
        self.url, self.period = url, period
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.sessions = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> QuerySampler:
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()

    def _sample(self) -> None:
        import psycopg

        conninfo = dsn(self.url)
        sessions = "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            first = _one(conn.execute(sessions).fetchone())
            while not self.stop.wait(self.period):
                rows: list[Any] = conn.execute(
                    "SELECT query, wait_event FROM pg_stat_activity"
                    " WHERE state = 'active' AND pid <> pg_backend_pid()"
                ).fetchall()
                self.samples += 1
                # A query that waits (for its client to read its rows: ClientWrite; for a
                # lock) is active but not on a CPU: its wait is named before it.
                self.counts.update(
                    (f"[{row[1]}] " if row[1] else "") + _gist(row[0]) for row in rows if row[0]
                )
            # Counted at each session's end; the statistics are a snapshot per transaction.
            conn.execute("SELECT pg_stat_clear_snapshot()")
            self.sessions = _one(conn.execute(sessions).fetchone()) - first


def dsn(url: str) -> str:
    """A store's SQLAlchemy URL as libpq takes it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def postmaster(url: str) -> Callable[[int, Process], bool]:
    """Whether a process is the PostgreSQL server of ``url`` (its postmaster or one of its
    children), on this machine; other servers (other jobs') are not. SQLite: none is."""
    if not url.startswith("postgresql"):
        return lambda pid, process: False
    import psycopg

    with psycopg.connect(dsn(url), autocommit=True) as conn:
        backend = _one(conn.execute("SELECT pg_backend_pid()").fetchone())
        server = _processes()[backend].parent
    return lambda pid, process: pid == server or process.parent == server


def _one(row: Any) -> int:
    return int(row[0]) if row and row[0] is not None else 0


def shares(counts: Mapping[str, int], top: int = 6) -> list[tuple[str, float]]:
    """The ``top`` most counted, each with its share of all counts."""
    total = sum(counts.values()) or 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
    return [(name, count / total) for name, count in ranked]


class Statements:
    """What ``pg_stat_statements`` counts over a span: each statement's calls and its time
    executing (on a CPU, or waiting inside, e.g. for its client to read rows), by gist.
    Only where the server loads the module (the bench's own server does); elsewhere
    ``available`` is False and it reports nothing."""

    def __init__(self, url: str) -> None:
        self.dsn = dsn(url)
        self.available = False
        self.rows: list[tuple[str, int, float]] = []  # gist, calls, ms

    def start(self) -> Statements:
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
            self.available = True
        except psycopg.Error:
            self.available = False
        return self

    def finish(self) -> None:
        import psycopg

        if not self.available:
            return
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows: list[Any] = conn.execute(
                "SELECT query, calls, total_exec_time + total_plan_time FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall()
        by_gist: dict[str, list[float]] = {}
        for query, calls, ms in rows:
            entry = by_gist.setdefault(_gist(query), [0, 0.0])
            entry[0] += calls
            entry[1] += ms
        self.rows = sorted(
            ((gist, int(calls), ms) for gist, (calls, ms) in by_gist.items()),
            key=lambda row: -row[2],
        )
