"""PostgreSQL writer benchmark, side by side in one run.

Sustained records/s of ``scalewatch.store.runs.write_steps`` into a PostgreSQL store (steps
by COPY, rollups upserted, run row; one transaction per batch) against raw psycopg COPY of
the same rows into the identical ``steps`` table, one transaction per batch. Goals:
>= 100k records/s and >= half the raw rate.

Without ``--db`` the bench starts a throwaway server of its own (``initdb``/``pg_ctl``
from Debian's ``postgresql`` package, as the tests do). With ``--db`` it uses that
database and DROPS ITS SCALEWATCH TABLES before each round: give it a scratch database.

    python bench/postgres.py [--db postgresql+psycopg://...] [--records 300000] [--batch 1000]
        [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _figures import figure  # noqa: E402
from telemetry import make_records  # noqa: E402

from scalewatch.store import downgrade, open_store, upgrade  # noqa: E402
from scalewatch.store.runs import create_run, step_rows, write_steps  # noqa: E402
from scalewatch.store.schema import steps  # noqa: E402

WRITER_GOAL_RECORDS_PER_S = 100_000
WRITER_GOAL_RATIO = 0.5
_COLUMNS = ", ".join(column.name for column in steps.c)


@contextlib.contextmanager
def _database(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests._helpers import postgres as _postgres

    bindir = _postgres.server_bindir()
    if bindir is None:
        sys.exit(f"bench/postgres.py: {_postgres.HOW_TO_GET_ONE}, or pass --db")
    with _postgres.cluster(bindir) as server:
        yield server.url(server.new_database())


def _fresh(url: str) -> None:
    """The store's schema at the head, with no rows."""
    upgrade(url)
    downgrade(url, "base")
    upgrade(url)


def _store_rate(url: str, records: list[Any], batch: int) -> float:
    _fresh(url)
    with open_store(url) as store:
        run = create_run(store, name="bench", world_size=8, config={}, control={})
        began = time.perf_counter()
        for first in range(0, len(records), batch):
            write_steps(store, run.id, records[first : first + batch])
        return len(records) / (time.perf_counter() - began)


def _raw_rate(url: str, records: list[Any], batch: int) -> float:
    _fresh(url)
    with open_store(url) as store:
        run = create_run(store, name="raw", world_size=8, config={}, control={})
    rows = step_rows(run.id, records)
    parsed = make_url(url).set(drivername="postgresql")
    conninfo = parsed.render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as conn:
        began = time.perf_counter()
        for first in range(0, len(rows), batch):
            with (
                conn.transaction(),
                conn.cursor() as cursor,
                cursor.copy(f"COPY steps ({_COLUMNS}) FROM STDIN") as copy,
            ):
                for row in rows[first : first + batch]:
                    copy.write_row(row)
        return len(rows) / (time.perf_counter() - began)


def bench_writer(url: str, records: int, batch: int, rounds: int) -> dict[str, Any]:
    """Best of ``rounds`` alternating runs of each writer, each into a fresh schema."""
    data = make_records(records)
    store_rates = []
    raw_rates = []
    for _ in range(rounds):
        store_rates.append(_store_rate(url, data, batch))
        raw_rates.append(_raw_rate(url, data, batch))
    store_rate, raw_rate = max(store_rates), max(raw_rates)
    return {
        "records": records,
        "batch": batch,
        "rounds": rounds,
        "store_records_per_s": store_rate,
        "raw_records_per_s": raw_rate,
        "ratio": store_rate / raw_rate,
        "store_rounds": store_rates,
        "raw_rounds": raw_rates,
    }


def print_writer(result: dict[str, Any]) -> None:
    rate, raw, ratio = result["store_records_per_s"], result["raw_records_per_s"], result["ratio"]
    print(
        f"postgres writer: {result['records']} records in batches of {result['batch']},"
        f" best of {result['rounds']} rounds"
    )
    rounds = ", ".join(f"{r:,.0f}" for r in result["store_rounds"])
    print(f"  write_steps (steps + rollups + run row): {rate:>10,.0f} records/s  [{rounds}]")
    rounds = ", ".join(f"{r:,.0f}" for r in result["raw_rounds"])
    print(f"  raw psycopg COPY (steps only):           {raw:>10,.0f} records/s  [{rounds}]")
    print(f"  ratio write_steps / raw: {ratio:.2f}")
    figure(
        "PostgreSQL writer throughput",
        f"{rate:,.0f} records/s",
        f">= {WRITER_GOAL_RECORDS_PER_S:,} records/s, >= {WRITER_GOAL_RATIO} of raw",
        rate >= WRITER_GOAL_RECORDS_PER_S and ratio >= WRITER_GOAL_RATIO,
        f"{ratio:.2f} x raw psycopg COPY ({raw:,.0f} records/s)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", help="a scratch PostgreSQL database (default: a server of its own)")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with _database(args.db) as url:
        print_writer(bench_writer(url, args.records, args.batch, args.rounds))


if __name__ == "__main__":
    main()
