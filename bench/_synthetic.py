"""A synthetic finished run of many steps for the service benchmarks, written straight into
a store at the head: steps in one transaction (SQLite ``executemany``, PostgreSQL COPY),
each row made by the store's own ``step_values`` from a ``StepRecord``; then the rollups
by the store's own recomputation in SQL (``refresh_rollups``), level by level. Nothing
here names a step's columns: a field added to the step schema reaches these rows too.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import make_url

from scalewatch.store.engine import open_store
from scalewatch.store.rollups import refresh_rollups
from scalewatch.store.runs import create_run, end_run
from scalewatch.store.schema import ROLLUP_LEVELS
from scalewatch.store.schema import steps as steps_table
from scalewatch.store.step_rows import step_values
from scalewatch.store.step_schema import StepRecord

CONTROL = {"growth_interval": 2000, "growth_factor": 2.0, "backoff_factor": 0.5}
CHUNK = 1_000_000
_COLUMNS = ", ".join(column.name for column in steps_table.c)


def step_rows(
    run_id: int, steps: int, overflows: set[int], after: dict[int, float]
) -> Iterator[tuple[Any, ...]]:
    """Rows of a scaler with torch's rules (interval 2000) that overflows at ``overflows``."""
    scale, tracker, t0 = 2.0**16, 0, 1_700_000_000.0
    for step in range(1, steps + 1):
        over = step in overflows
        if over:
            new, tracker, ranks = scale * 0.5, 0, (step % 8,)
            after[step] = new
        elif tracker == 1999:
            new, tracker, ranks = min(scale * 2.0, 2.0**24), 0, ()
        else:
            new, tracker, ranks = scale, tracker + 1, ()
        record = StepRecord(
            step=step,
            wall_time=t0 + step * 0.1,
            scale=scale,
            overflow=over,
            skipped=over,
            inf_ranks=ranks,
            scale_after=new,
            growth_tracker=tracker,
            growth_interval=CONTROL["growth_interval"],
            growth_factor=CONTROL["growth_factor"],
            backoff_factor=CONTROL["backoff_factor"],
            control_version=0,
            loss=2.0 + 1.0 / step,  # a loss every step, as the scaler records it
            lr=1e-3 * min(1.0, step / 1000),  # and a learning rate: a warmup, then flat
        )
        yield (run_id, *step_values(record))
        scale = new


def _rollups(cursor: Any, run: int, steps: int) -> None:
    """Every level's buckets of steps 1..``steps``, recomputed in SQL by the store's own
    statements: told of one step in each finest bucket, which covers every bucket."""
    finest = min(ROLLUP_LEVELS.values())
    marks = [(run, step) for step in [*range(1, steps + 1, finest), steps]]
    started = time.perf_counter()
    refresh_rollups(cursor, run, marks, fresh=False)
    print(f"  rollups of {len(ROLLUP_LEVELS)} levels {time.perf_counter() - started:6.1f} s")


def build(url: str, steps: int, n_overflows: int) -> tuple[int, dict[int, float]]:
    """A finished run of ``steps`` steps in the store at ``url`` (SQLite or PostgreSQL);
    returns its id and ``{overflow step: scale after}``."""
    with open_store(url) as store:
        run = create_run(store, name="bench-10M", world_size=8, config={}, control=CONTROL).id
        end_run(store, run)
    rng = random.Random(0)
    overflows = set(rng.sample(range(1, steps + 1), n_overflows))
    after: dict[int, float] = {}
    rows = step_rows(run, steps, overflows, after)
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        _build_postgres(conninfo, run, steps, rows)
    else:
        _build_sqlite(Path(parsed.database or ""), run, steps, rows)
    return run, after


def _progress(done: int, steps: int, started: float) -> None:
    print(f"  steps {done:>11,} / {steps:,}  {time.perf_counter() - started:6.1f} s", flush=True)


def _build_sqlite(path: Path, run: int, total: int, rows: Iterator[tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    started = time.perf_counter()
    conn.execute("BEGIN")
    for done in range(0, total, CHUNK):
        batch = [row for _, row in zip(range(CHUNK), rows, strict=False)]
        marks = ",".join("?" * len(steps_table.c))
        conn.executemany(f"INSERT INTO steps ({_COLUMNS}) VALUES ({marks})", batch)
        _progress(done + len(batch), total, started)
    _rollups(conn.cursor(), run, total)
    conn.execute("UPDATE runs SET last_step = ? WHERE id = ?", (total, run))
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def _build_postgres(conninfo: str, run: int, steps: int, rows: Iterator[tuple[Any, ...]]) -> None:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(conninfo) as conn:
        with conn.transaction(), conn.cursor() as cursor:
            with cursor.copy(f"COPY steps ({_COLUMNS}) FROM STDIN") as copy:
                for done, row in enumerate(rows, 1):
                    copy.write_row(row)
                    if done % CHUNK == 0:
                        _progress(done, steps, started)
            _rollups(cursor, run, steps)
            cursor.execute(b"UPDATE runs SET last_step = %s WHERE id = %s", (steps, run))
        conn.autocommit = True
        conn.execute(b"VACUUM ANALYZE steps")
        conn.execute(b"VACUUM ANALYZE step_rollups")
