"""The writer's command queue (scalewatch.telemetry._queue): one order for every kind of
command, dropped steps a gap in their place, what failed back at the front."""

from __future__ import annotations

from scalewatch._control import ControlOutcome, ControlSource
from scalewatch._recording.recorder import StepSample
from scalewatch.store.records import ScaleLoad
from scalewatch.telemetry._queue import CommandQueue, RecordGap, RecordLoad, WriteOutcome
from tests._helpers.records import step_record

OUTCOME = ControlOutcome(
    source=ControlSource.CODE,
    request_id=None,
    values={"growth_interval": 5},
    applied=True,
    reason=None,
    state={},
    version=1,
)
LOAD = ScaleLoad(step=2, at=1.0, scale_after=8.0)


def _steps(*numbers: int, outcome_at: int | None = None) -> list[StepSample]:
    return [StepSample(step_record(n), (OUTCOME,) if n == outcome_at else ()) for n in numbers]


def _shape(taken: list[object]) -> object:
    """Steps as their numbers, the rest as they are."""
    return [c[0] if isinstance(c, tuple) else c for c in taken]


def test_commands_come_out_in_the_order_they_went_in() -> None:
    queue = CommandQueue(max_pending=100, batch=10)
    queue.put(_steps(1, 2, outcome_at=2))
    queue.put_load(LOAD)
    queue.put(_steps(3))
    taken = []
    while part := queue.take():
        taken.append(_shape(part))
        queue.written()
    assert taken == [
        [1, 2],
        [WriteOutcome(2, step_record(2).wall_time, OUTCOME)],
        [RecordLoad(LOAD)],
        [3],
    ]
    assert not queue.pending()


def test_the_oldest_steps_dropped_leave_a_gap_where_they_were() -> None:
    queue = CommandQueue(max_pending=3, batch=10)
    queue.put_load(LOAD)
    queue.put(_steps(1, 2, 3))
    queue.put(_steps(4, 5))  # two over the bound: 1 and 2 go
    assert queue.dropped == 2 and queue.unwritten() == 3
    assert queue.take() == [RecordLoad(LOAD)]  # what was ahead of them stays ahead
    assert queue.take() == [RecordGap(1, 2, 2)]
    assert _shape(queue.take()) == [3, 4, 5]


def test_a_batch_that_failed_comes_back_first_and_counts_while_written() -> None:
    queue = CommandQueue(max_pending=4, batch=2)
    queue.put(_steps(1, 2, 3))
    batch = queue.take()
    assert _shape(batch) == [1, 2] and queue.unwritten() == 3
    queue.put(_steps(4, 5))  # 1, 2 are being written: 3 is dropped, not them
    assert queue.dropped == 1
    queue.put_back(batch)
    queue.written()
    assert _shape(queue.take()) == [1, 2]
    queue.written()
    assert queue.take() == [RecordGap(3, 3, 1)]


def test_a_command_being_carried_out_keeps_the_queue_pending() -> None:
    """A flush waits for the outcome the writer is writing, though none is queued."""
    queue = CommandQueue(max_pending=10, batch=10)
    queue.put_load(LOAD)
    assert queue.take() == [RecordLoad(LOAD)]
    assert queue.pending()
    queue.written()
    assert not queue.pending()


def test_touching_gaps_are_taken_as_one() -> None:
    queue = CommandQueue(max_pending=4, batch=10)
    queue.put(_steps(1, 2))
    batch = queue.take()  # 1, 2 in flight
    queue.put(_steps(3, 4, 5))  # one over the bound: 3 dropped
    queue.put_back(batch)
    queue.written()
    queue.put(_steps(6, 7))  # 1, 2 dropped now, before 3's gap
    assert queue.dropped == 3
    assert queue.take() == [RecordGap(1, 3, 3)]
    assert _shape(queue.take()) == [4, 5, 6, 7]
