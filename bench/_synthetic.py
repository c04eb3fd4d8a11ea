"""A synthetic finished run of many steps for the service benchmarks, written straight into
a store at the head: steps in one transaction (SQLite ``executemany``, PostgreSQL COPY),
then rollups computed in SQL, level by level (``INSERT ... SELECT ... GROUP BY``), the
finest from ``steps``, each coarser one from the level below.
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
from scalewatch.store.runs import create_run, end_run
from scalewatch.store.schema import ROLLUP_LEVELS, step_rollups, steps
from scalewatch.store.schema import steps as steps_table

CONTROL = {"growth_interval": 2000, "growth_factor": 2.0, "backoff_factor": 0.5}
CHUNK = 1_000_000
TAIL = (2000, 2.0, 0.5, 0)  # growth_interval, growth_factor, backoff_factor, control_version
_COLUMNS = ", ".join(column.name for column in steps.c)
_ROLLUP_COLUMNS = ", ".join(column.name for column in step_rollups.c)
# Per dialect: the scale's bounds over both columns, and a flag as a number.
_DIALECT = {
    "sqlite": {
        "lo": "min(min(scale), min(scale_after))",
        "hi": "max(max(scale), max(scale_after))",
        "int": "{}",
    },
    "postgresql": {
        "lo": "least(min(scale), min(scale_after))",
        "hi": "greatest(max(scale), max(scale_after))",
        "int": "{}::int",
    },
}


def step_rows(
    run_id: int, steps: int, overflows: set[int], after: dict[int, float]
) -> Iterator[tuple[Any, ...]]:
    """Rows of a scaler with torch's rules (interval 2000) that overflows at ``overflows``."""
    scale, tracker, t0 = 2.0**16, 0, 1_700_000_000.0
    for step in range(1, steps + 1):
        if step in overflows:
            new, tracker, ranks = scale * 0.5, 0, str(step % 8)
            after[step] = new
        elif tracker == 1999:
            new, tracker, ranks = min(scale * 2.0, 2.0**24), 0, ""
        else:
            new, tracker, ranks = scale, tracker + 1, ""
        over = step in overflows
        loss = 2.0 + 1.0 / step  # a loss every step, as the scaler records it
        lr = 1e-3 * min(1.0, step / 1000)  # and a learning rate: a warmup, then flat
        yield (run_id, step, t0 + step * 0.1, scale, over, over, ranks, new, tracker, *TAIL,
               loss, "", 0, lr, None, None)  # fmt: skip
        scale = new


def _rollup_sql(dialect: str, run: int) -> Iterator[tuple[str, int, int]]:
    """(statements, level, width) for each level, finest first."""
    d = _DIALECT[dialect]
    child: tuple[int, int] | None = None
    for level, width in sorted(ROLLUP_LEVELS.items(), key=lambda item: item[1]):
        if child is None:
            source = (
                f"SELECT run_id, {level}, step / {width}, min(step), max(step), count(*),"
                f" {d['lo']}, {d['hi']}, 0.0, min(growth_tracker), max(growth_tracker), 0,"
                f" sum({d['int'].format('overflow')}), sum({d['int'].format('skipped')}),"
                " min(loss), max(loss), min(lr), max(lr)"
                f" FROM steps WHERE run_id = {run} GROUP BY run_id, step / {width}"
            )
        else:
            ratio = width // child[1]
            source = (
                f"SELECT run_id, {level}, bucket / {ratio}, min(first_step), max(last_step),"
                " sum(n), min(scale_min), max(scale_max), 0.0, min(tracker_min),"
                " max(tracker_max), 0, sum(overflows), sum(skipped), min(loss_min),"
                " max(loss_max), min(lr_min), max(lr_max) FROM step_rollups"
                f" WHERE run_id = {run} AND level = {child[0]} GROUP BY run_id, bucket / {ratio}"
            )
        yield f"INSERT INTO step_rollups ({_ROLLUP_COLUMNS}) {source}", level, width
        yield (
            (
                "UPDATE step_rollups SET (scale_last, tracker_last) = (SELECT scale_after,"
                " growth_tracker FROM steps WHERE steps.run_id = step_rollups.run_id"
                " AND steps.step = step_rollups.last_step)"
                f" WHERE run_id = {run} AND level = {level}"
            ),
            level,
            width,
        )
        child = (level, width)


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


def _build_sqlite(path: Path, run: int, steps: int, rows: Iterator[tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    started = time.perf_counter()
    conn.execute("BEGIN")
    for done in range(0, steps, CHUNK):
        batch = [row for _, row in zip(range(CHUNK), rows, strict=False)]
        marks = ",".join("?" * len(steps_table.c))
        conn.executemany(f"INSERT INTO steps ({_COLUMNS}) VALUES ({marks})", batch)
        _progress(done + len(batch), steps, started)
    for sql, level, width in _rollup_sql("sqlite", run):
        conn.execute(sql)
        if sql.startswith("UPDATE"):
            print(f"  rollups level {level} (width {width})", flush=True)
    conn.execute("UPDATE runs SET last_step = ? WHERE id = ?", (steps, run))
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
            for sql, level, width in _rollup_sql("postgresql", run):
                cursor.execute(sql.encode())
                if sql.startswith("UPDATE"):
                    print(f"  rollups level {level} (width {width})", flush=True)
            cursor.execute(b"UPDATE runs SET last_step = %s WHERE id = %s", (steps, run))
        conn.autocommit = True
        conn.execute(b"VACUUM ANALYZE steps")
        conn.execute(b"VACUUM ANALYZE step_rollups")
