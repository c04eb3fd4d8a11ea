"""What a job's batch answer reads: the run's owner and last batch, and its pending
control requests, oldest first, on both backends."""

from __future__ import annotations

import pytest

from scalewatch.store.batches import BatchState, advance_sequence, batch_state_and_pending
from scalewatch.store.control import mark_applied, request_control
from scalewatch.store.engine import Store
from scalewatch.store.errors import RunNotFound
from scalewatch.store.records import RunRef
from scalewatch.store.runs import create_run
from tests._helpers.service import CONTROL


def test_a_batchs_answer_reads_the_runs_state_and_its_pending_requests(
    store: Store, run: RunRef
) -> None:
    assert batch_state_and_pending(store, run.id) == (BatchState(run.id, None, 0), [])
    owned = create_run(store, name="job", world_size=1, config={}, control=CONTROL, owner="job-42")
    advance_sequence(store, owned.id, 7)
    first = request_control(store, run.id, {"growth_interval": 8}, requested_by="ops")
    applied = request_control(store, run.id, {"growth_interval": 9}, requested_by="ops")
    mark_applied(
        store, applied.id, step=3, at=1.0, state={**CONTROL, "growth_interval": 9}, version=1
    )
    last = request_control(store, run.id, {"growth_factor": 3.0}, requested_by="ops")
    request_control(store, owned.id, {"growth_interval": 5}, requested_by="ops")

    state, pending = batch_state_and_pending(store, run.id)
    assert state == BatchState(run.id, None, 0)
    assert [(r.id, dict(r.values)) for r in pending] == [
        (first.id, {"growth_interval": 8}),
        (last.id, {"growth_factor": 3.0}),
    ]
    state, pending = batch_state_and_pending(store, owned.id)
    assert state == BatchState(owned.id, "job-42", 7)
    assert [dict(r.values) for r in pending] == [{"growth_interval": 5}]
    with pytest.raises(RunNotFound):
        batch_state_and_pending(store, owned.id + 100)
