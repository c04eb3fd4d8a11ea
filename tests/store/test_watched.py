"""The evaluator's reads: the new steps of many runs, by run and step, however written."""

from __future__ import annotations

from scalewatch.store import Store
from scalewatch.store.runs import create_run, write_steps
from scalewatch.store.watched import new_steps
from tests._helpers.records import step_record


def test_new_steps_come_by_run_and_step_after_each_cursor(store: Store) -> None:
    ids = [
        create_run(store, name=f"r{i}", world_size=1, config={}, control={}).id for i in range(5)
    ]
    for first in (41, 1, 21):  # later steps stored first, the runs' writes interleaved
        for run in reversed(ids):
            write_steps(store, run, [step_record(s) for s in range(first, first + 20)])
    cursors = {run: 10 * i for i, run in enumerate(ids)}  # 60 steps each: 20 to 50 new
    rows = new_steps(store, cursors, per_run=25, runs_per_read=2)
    wanted = [(run, step) for run in sorted(ids) for step in range(cursors[run] + 1, 61)[:25]]
    assert [(row[0], row[1]) for row in rows] == wanted
