"""The synthetic run the service benchmarks build (``bench/_synthetic.py``) is what the
store's own writer makes of the same steps: its rows, and its rollups recomputed in SQL
equal to those the writer folds batch by batch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sqlalchemy import select

from scalewatch.store.engine import open_store
from scalewatch.store.runs import create_run, write_step_values
from scalewatch.store.schema import step_rollups, steps

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _synthetic() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_synthetic", BENCH / "_synthetic.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_synthetic", module)
    spec.loader.exec_module(module)
    return module


def _rows(url: str, table: Any, run: int) -> list[tuple[Any, ...]]:
    key = [c for c in table.primary_key.columns if c.name != "run_id"]
    columns = [c for c in table.c if c.name != "run_id"]
    with open_store(url) as store, store.read() as conn:
        return [
            tuple(r)
            for r in conn.execute(select(*columns).where(table.c.run_id == run).order_by(*key))
        ]


def test_the_synthetic_run_is_what_the_writer_makes_of_its_steps(db_url: str) -> None:
    synthetic = _synthetic()
    total = 5_000  # whole buckets of the finer levels, the first of the wider ones in part
    run, after = synthetic.build(db_url, total, 40)
    assert len(after) == 40
    with open_store(db_url) as store:
        twin = create_run(store, name="twin", world_size=8, config={}, control=synthetic.CONTROL).id
        values = [row[1:] for row in synthetic.step_rows(twin, total, set(after), {})]
        for first in range(0, total, 100):  # as a job's batches come
            write_step_values(store, twin, values[first : first + 100])
    assert _rows(db_url, steps, run) == _rows(db_url, steps, twin)
    built, folded = _rows(db_url, step_rollups, run), _rows(db_url, step_rollups, twin)
    assert len(built) > total // 8
    assert built == folded
