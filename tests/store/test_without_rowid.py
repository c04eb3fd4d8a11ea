from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection

from scalewatch.store import downgrade, open_store, upgrade
from scalewatch.store.engine import make_engine
from scalewatch.store.records import StepRecord
from scalewatch.store.runs import create_run, write_steps
from tests._helpers.records import step_record
from tests._helpers.stored import CONTROL

INITIAL = "e3f1a9c07b42"
# The columns of steps and step_rollups at INITIAL; later revisions append theirs.
STEPS_THEN, ROLLUPS_THEN = 13, 14
# PostgreSQL has no WITHOUT ROWID tables; the revision is a no-op there.
pytestmark = pytest.mark.sqlite_only


def _records(count: int) -> list[StepRecord]:
    return [
        step_record(
            step,
            overflow=step % 7 == 0,
            inf_ranks=(0, 1) if step % 7 == 0 else (),
            scale_after=512.0 if step % 7 == 0 else 1024.0,
            growth_tracker=step % 5,
            growth_interval=5,
        )
        for step in range(count)
    ]


def _snapshot(url: str) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {
                "steps": conn.exec_driver_sql("SELECT * FROM steps ORDER BY 1, 2").fetchall(),
                "rollups": conn.exec_driver_sql(
                    "SELECT * FROM step_rollups ORDER BY 1, 2, 3"
                ).fetchall(),
                "ddl": dict(
                    conn.exec_driver_sql(
                        "SELECT name, sql FROM sqlite_master WHERE tbl_name IN"
                        " ('steps', 'step_rollups', 'overflow_params') AND sql IS NOT NULL"
                    ).fetchall()
                ),
                "plan": _plan(conn),
            }
    finally:
        engine.dispose()


def _plan(conn: Connection) -> str:
    rows = conn.exec_driver_sql(
        "EXPLAIN QUERY PLAN SELECT * FROM steps WHERE run_id = 1 AND step BETWEEN 10 AND 20"
    ).fetchall()
    return " ".join(str(row[-1]) for row in rows)


def test_steps_and_rollups_are_clustered_and_survive_both_ways(db_url: str) -> None:
    with open_store(db_url) as store:
        run = create_run(store, name="r", world_size=2, config={}, control=CONTROL)
        write_steps(store, run.id, _records(300))
    head = _snapshot(db_url)
    assert head["ddl"]["steps"].rstrip().endswith("WITHOUT ROWID")
    assert head["ddl"]["step_rollups"].rstrip().endswith("WITHOUT ROWID")
    assert head["ddl"]["ix_steps_overflow"].endswith("WHERE overflow")
    assert "USING PRIMARY KEY" in head["plan"]
    assert len(head["steps"]) == 300 and head["rollups"]

    downgrade(db_url, INITIAL)
    before = _snapshot(db_url)
    assert "WITHOUT ROWID" not in before["ddl"]["steps"]
    assert "WITHOUT ROWID" not in before["ddl"]["step_rollups"]
    assert before["ddl"]["ix_steps_overflow"].endswith("WHERE overflow")
    assert before["steps"] == [row[:STEPS_THEN] for row in head["steps"]]
    # The previous revision's levels: 64, 4096 and 262144 steps, numbered 1, 2, 3.
    renumbered = {1: 1, 3: 2, 5: 3}
    assert before["rollups"] == [
        (row[0], renumbered[row[1]], *row[2:ROLLUPS_THEN])
        for row in head["rollups"]
        if row[1] in renumbered
    ]

    upgrade(db_url)
    assert _snapshot(db_url) == head
