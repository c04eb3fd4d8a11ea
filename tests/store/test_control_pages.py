"""The audit trail a page at a time: keyset pages of one run's requests, on both backends."""

from __future__ import annotations

import time

import pytest

from scalewatch.store import RunNotFound, RunRef, Store
from scalewatch.store.control import control_history, control_history_page, request_control
from scalewatch.store.runs import HEARTBEAT_TIMEOUT_S, create_run, heartbeat
from tests._helpers.stored import CONTROL


def _request(store: Store, run: RunRef, interval: int) -> int:
    return request_control(store, run.id, {"growth_interval": interval}, requested_by="t").id


def test_pages_walk_the_history_newest_first_each_oldest_first(store: Store, run: RunRef) -> None:
    other = create_run(store, name="other", world_size=1, config={}, control=CONTROL)
    ids = []
    for i in range(7):  # the two runs' requests interleave in the id sequence
        ids.append(_request(store, run, 10 + i))
        _request(store, other, 100 + i)
    pages, before = [], None
    while True:
        page = control_history_page(store, run.id, before=before, limit=3)
        pages.append([row.id for row in page.rows])
        if page.older is None:
            break
        before = page.older
    assert pages == [ids[4:], ids[1:4], ids[:1]]
    whole = control_history_page(store, run.id)
    assert whole.rows == control_history(store, run.id) and whole.older is None
    exact = control_history_page(store, run.id, limit=7)
    assert [row.id for row in exact.rows] == ids and exact.older is None
    assert control_history_page(store, run.id, before=ids[0]).rows == []
    assert [r.values for r in control_history_page(store, run.id, limit=1).rows] == [
        {"growth_interval": 16}
    ]


def test_a_page_of_a_crashed_run_shows_its_pending_requests_rejected(
    store: Store, run: RunRef
) -> None:
    first, second = _request(store, run, 10), _request(store, run, 11)
    heartbeat(store, run.id, at=time.time() - HEARTBEAT_TIMEOUT_S - 5)
    page = control_history_page(store, run.id, limit=1)
    (shown,) = page.rows
    assert (shown.id, shown.status, shown.reason) == (second, "rejected", "the run crashed first")
    assert page.older == second
    assert [row.id for row in control_history_page(store, run.id, before=second).rows] == [first]


def test_a_page_of_no_run_or_of_no_rows(store: Store, run: RunRef) -> None:
    with pytest.raises(RunNotFound):
        control_history_page(store, run.id + 1)
    with pytest.raises(ValueError, match="limit"):
        control_history_page(store, run.id, limit=0)
    empty = control_history_page(store, run.id)
    assert (empty.rows, empty.older) == ([], None)


@pytest.mark.sqlite_only
def test_a_page_reads_the_runs_index_in_key_order(store: Store, run: RunRef) -> None:
    """No sort of the run's whole history: SQLite walks ix_control_requests_run_id."""
    others = [
        create_run(store, name=f"other {i}", world_size=1, config={}, control=CONTROL)
        for i in range(4)
    ]
    for i in range(20):
        for each in (run, *others):
            _request(store, each, 10 + i)
    with store.read() as conn:
        conn.exec_driver_sql("ANALYZE")
        plan = " ".join(
            str(row[-1])
            for row in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT * FROM control_requests WHERE run_id = ? AND id < ?"
                " ORDER BY id DESC LIMIT 4",
                (run.id, 15),
            )
        )
    assert "ix_control_requests_run_id" in plan and "TEMP B-TREE" not in plan, plan
