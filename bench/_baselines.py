"""The fleet bench's raw baselines: the least the machine can spend on what the fleet did.

:func:`store_rows`: the same rows as the writers', batch by batch, one transaction a batch,
by the driver alone (PostgreSQL: psycopg's ``COPY``; SQLite: sqlite3's ``executemany``)
into the same ``steps`` table, under runs of their own. :func:`sse_bytes`: the same step
events (:func:`~scalewatch.app.live.sse.step_events`, encoded before the clock starts)
written by a bare asyncio server to the same SSE clients (``tests._helpers.load sse``),
a batch of a run at a time, on as many sockets. Each gives the CPU seconds it cost by
component (the bench's thread, PostgreSQL's processes) and the records it covered, so
that the report divides both by the same thousand records as the fleet's.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _cpu import CpuSplit, dsn, postmaster

from scalewatch.app.live.sse import step_events
from scalewatch.store.engine import open_store
from scalewatch.store.runs import create_run, step_rows
from scalewatch.store.schema import steps
from scalewatch.store.step_rows import step_values
from tests._helpers.load import records, result, spawn, wait_streams_open

_COLUMNS = ", ".join(column.name for column in steps.c)

__all__ = ["Baseline", "sse_bytes", "store_rows"]


@dataclass
class Baseline:
    """What a baseline covered (``records``) and the CPU seconds it cost, by component."""

    name: str
    records: int
    cpu_s: dict[str, float] = field(default_factory=dict)

    def per_thousand(self) -> dict[str, float]:
        """CPU milliseconds per 1000 records, by component."""
        return {k: 1e6 * v / max(1, self.records) for k, v in self.cpu_s.items()}


def _batches(run_ids: list[int], steps_each: int, batch: int) -> list[list[tuple[Any, ...]]]:
    """The writers' batches of ``run_ids`` (step 1 on), round robin over the runs."""
    wall = time.time()
    out = []
    for first in range(1, steps_each + 1, batch):
        for run in run_ids:
            out.append(step_rows(run, records(first, batch, wall)))
    return out


def _postgres_writes(url: str) -> tuple[Callable[[list[tuple[Any, ...]]], None], Any]:
    import psycopg

    conn = psycopg.connect(dsn(url))

    def copy(rows: list[tuple[Any, ...]]) -> None:
        with (
            conn.transaction(),
            conn.cursor() as cursor,
            cursor.copy(f"COPY steps ({_COLUMNS}) FROM STDIN") as out,
        ):
            for row in rows:
                out.write_row(row)

    return copy, conn


def _sqlite_writes(url: str) -> tuple[Callable[[list[tuple[Any, ...]]], None], Any]:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
    marks = ", ".join("?" for _ in steps.c)
    insert = f"INSERT INTO steps ({_COLUMNS}) VALUES ({marks})"

    def executemany(rows: list[tuple[Any, ...]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, rows)
        conn.execute("COMMIT")

    return executemany, conn


def store_rows(url: str, runs: int, steps_each: int, batch: int) -> Baseline:
    """``runs`` new runs of ``steps_each`` steps each, written as the writers' batches are."""
    with open_store(url) as store:
        run_ids = [
            create_run(store, name=f"raw-{i:02d}", world_size=8, config={}, control={}).id
            for i in range(runs)
        ]
    batches = _batches(run_ids, steps_each, batch)
    postgres = url.startswith("postgresql")
    write, conn = (_postgres_writes if postgres else _sqlite_writes)(url)
    name = "COPY" if postgres else "executemany"
    ours = postmaster(url)
    split = CpuSplit(lambda pid, process: "PostgreSQL" if ours(pid, process) else None).start()
    try:
        began = time.thread_time()
        for rows in batches:
            write(rows)
        client = time.thread_time() - began
    finally:
        split.finish()
        conn.close()
    cpu = {f"{name} client": client}
    if postgres:
        cores = split.cores().get("PostgreSQL", 0.0)
        cpu["PostgreSQL"] = cores * (split.ended - split.began)
    return Baseline(name=name, records=sum(map(len, batches)), cpu_s=cpu)


class _Server:
    """A bare SSE server: answers each ``GET /api/runs/{run}/stream`` with a head, then,
    once ``clients`` have asked, writes each run's chunks to its streams, chunk by chunk."""

    def __init__(self, chunks: dict[int, list[bytes]], clients: int) -> None:
        self.chunks, self.clients = chunks, clients
        self.streams: dict[int, list[asyncio.StreamWriter]] = {}
        self.answers: list[asyncio.Task[Any]] = []
        self.cpu_s = 0.0
        self.port = 0
        self.ready = threading.Event()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.answers.append(task)
        head = await reader.readuntil(b"\r\n\r\n")
        run = int(head.split(b" ", 2)[1].split(b"/")[3])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        self.streams.setdefault(run, []).append(writer)
        try:
            await reader.read()  # until the client leaves
        finally:
            writer.close()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        while sum(map(len, self.streams.values())) < self.clients:
            await asyncio.sleep(0.01)
        began = time.thread_time()
        rounds = max(map(len, self.chunks.values()))
        for i in range(rounds):
            for run, chunks in self.chunks.items():
                if i < len(chunks):
                    for writer in self.streams.get(run, ()):
                        writer.write(chunks[i])
            await asyncio.sleep(0)  # the loop sends what it can, as the service's does
        for writers in self.streams.values():
            for writer in writers:
                await writer.drain()
        self.cpu_s = time.thread_time() - began
        await asyncio.wait(self.answers, timeout=60)  # each client leaves at its last step
        server.close()

    def run(self) -> None:
        asyncio.run(self._serve())


def sse_bytes(runs: int, clients: int, steps_each: int, batch: int) -> Baseline:
    """``steps_each`` step events of each of ``runs`` runs to ``clients`` streams (round
    robin over the runs), a batch's events a write."""
    run_ids = list(range(1, runs + 1))
    wall = time.time()
    chunks = {
        run: [
            step_events([step_values(r) for r in records(first, batch, wall)]).encode("ascii")
            for first in range(1, steps_each + 1, batch)
        ]
        for run in run_ids
    }
    last_step = (steps_each // batch) * batch
    server = _Server(chunks, clients)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    server.ready.wait(10)
    sse = spawn(
        "sse", f"http://127.0.0.1:{server.port}", ",".join(map(str, run_ids)), clients, last_step,
        120, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_streams_open(sse)
    streams = result(sse, 180)["clients"]
    thread.join(30)
    if not all(s["last"] == last_step and not s["gaps"] for s in streams):
        raise RuntimeError("the raw SSE baseline's clients did not see every step")
    return Baseline(name="SSE bytes", records=runs * last_step, cpu_s={"writes": server.cpu_s})
