"""Telemetry benchmarks, side by side in one run.

Writer: sustained records/s of ``scaler.store.runs.write_steps`` (batches into a fresh
file store: steps, rollups, run row, one transaction per batch) against a raw
``sqlite3`` ``executemany`` of the same rows into an identical table with the same
pragmas. Goals: >= 100k records/s and >= half the raw rate.

    python bench/telemetry.py [--records 300000] [--batch 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from scaler.store import StepRecord, open_store, upgrade
from scaler.store.engine import BUSY_TIMEOUT_MS
from scaler.store.runs import create_run, write_steps

WRITER_GOAL_RECORDS_PER_S = 100_000
WRITER_GOAL_RATIO = 0.5

_RAW_PRAGMAS = (
    f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)
_RAW_INSERT = (
    "INSERT INTO steps (run_id, step, wall_time, scale, overflow, skipped, inf_ranks,"
    " scale_after, growth_tracker, growth_interval, growth_factor, backoff_factor,"
    " control_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def make_records(count: int) -> list[StepRecord]:
    """A plausible fp16 run: growth every 2000 clean steps, an overflow every ~700."""
    records: list[StepRecord] = []
    scale, tracker, start = 65536.0, 0, time.time()
    for step in range(1, count + 1):
        overflow = step % 701 == 0
        if overflow:
            after, tracker = scale * 0.5, 0
        else:
            tracker += 1
            after = scale * 2.0 if tracker == 2000 else scale
            tracker %= 2000
        records.append(
            StepRecord(
                step=step,
                wall_time=start + step * 0.05,
                scale=scale,
                overflow=overflow,
                skipped=overflow,
                inf_ranks=(step % 8,) if overflow else (),
                scale_after=after,
                growth_tracker=tracker,
                growth_interval=2000,
                growth_factor=2.0,
                backoff_factor=0.5,
                control_version=0,
            )
        )
        scale = after
    return records


def _store_rate(directory: Path, records: list[StepRecord], batch: int) -> float:
    with open_store(f"sqlite:///{directory / 'store.db'}") as store:
        run = create_run(store, name="bench", world_size=8, config={}, control={})
        began = time.perf_counter()
        for first in range(0, len(records), batch):
            write_steps(store, run.id, records[first : first + batch])
        return len(records) / (time.perf_counter() - began)


def _raw_rate(directory: Path, records: list[StepRecord], batch: int) -> float:
    path = directory / "raw.db"
    upgrade(f"sqlite:///{path}")  # the identical schema: same table, keys and indexes
    rows = [
        (
            1,
            r.step,
            r.wall_time,
            r.scale,
            r.overflow,
            r.skipped,
            ",".join(map(str, r.inf_ranks)),
            r.scale_after,
            r.growth_tracker,
            r.growth_interval,
            r.growth_factor,
            r.backoff_factor,
            r.control_version,
        )
        for r in records
    ]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for pragma in _RAW_PRAGMAS:
            conn.execute(pragma)
        conn.execute(
            "INSERT INTO runs VALUES (1, 'raw', 'raw', 'running', 8, '{}', '{}', 0, '', '',"
            " 0, 0.0, NULL, 0.0, 0, 0)"
        )
        began = time.perf_counter()
        for first in range(0, len(rows), batch):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_RAW_INSERT, rows[first : first + batch])
            conn.execute("COMMIT")
        return len(rows) / (time.perf_counter() - began)
    finally:
        conn.close()


def bench_writer(records: int = 300_000, batch: int = 1000, rounds: int = 2) -> dict[str, Any]:
    """Best of ``rounds`` alternating runs of each writer, each into a fresh file."""
    data = make_records(records)
    store_rates: list[float] = []
    raw_rates: list[float] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as scratch:
            store_rates.append(_store_rate(Path(scratch), data, batch))
        with tempfile.TemporaryDirectory() as scratch:
            raw_rates.append(_raw_rate(Path(scratch), data, batch))
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


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def print_writer(result: dict[str, Any]) -> None:
    rate, raw, ratio = (
        result["store_records_per_s"],
        result["raw_records_per_s"],
        result["ratio"],
    )
    print(
        f"writer: {result['records']} records in batches of {result['batch']},"
        f" best of {result['rounds']} rounds"
    )
    rounds = ", ".join(f"{r:,.0f}" for r in result["store_rounds"])
    print(f"  write_steps (steps + rollups + run row): {rate:>10,.0f} records/s  [{rounds}]")
    rounds = ", ".join(f"{r:,.0f}" for r in result["raw_rounds"])
    print(f"  raw sqlite3 executemany (steps only):    {raw:>10,.0f} records/s  [{rounds}]")
    print(f"  ratio write_steps / raw: {ratio:.2f}")
    print(
        f"  goal >= {WRITER_GOAL_RECORDS_PER_S:,} records/s:"
        f" {_verdict(rate >= WRITER_GOAL_RECORDS_PER_S)};"
        f" goal ratio >= {WRITER_GOAL_RATIO}: {_verdict(ratio >= WRITER_GOAL_RATIO)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print_writer(bench_writer(args.records, args.batch, args.rounds))


if __name__ == "__main__":
    main()
