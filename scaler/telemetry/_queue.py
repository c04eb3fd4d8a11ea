"""The writer's bounded queue: records, control outcomes and scale loads waiting for the store.

The recorder thread puts, the writer thread takes; neither waits on the store. Past
``max_pending`` records the oldest are dropped, counted and kept as ranges of steps
(gaps) for the writer to record once the store takes writes again.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from .._control import ControlOutcome
from .._recording.recorder import StepSample
from ..store.records import ScaleLoad
from ..store.runs import finding_rows, step_values

Gap = tuple[int, int, int]  # (first step, last step, records dropped): a whole range


class Diagnosed(tuple[Any, ...]):
    """The :func:`step_values` of an overflow step that carries its findings as
    ``overflow_params`` rows: queued, put back and dropped with its step as one item.

    Rare (an explained overflow), so clean records stay plain tuples.
    """

    findings: list[tuple[Any, ...]]

    def __new__(cls, values: tuple[Any, ...], findings: list[tuple[Any, ...]]) -> Diagnosed:
        self = super().__new__(cls, values)
        self.findings = findings
        return self


def findings_of(batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The ``overflow_params`` rows of the records in ``batch``."""
    return [row for values in batch if type(values) is Diagnosed for row in values.findings]


@dataclass(frozen=True, slots=True)
class QueuedOutcome:
    """A control outcome to write; ``step`` is None for one settled at no step."""

    step: int | None
    at: float
    outcome: ControlOutcome


class RecordQueue:
    """Records as :func:`step_values` tuples, outcomes, scale loads, and the gaps of records
    dropped;
    and how the writer and those who wait for it meet, in these methods alone.

    ``lock`` guards everything here; ``_idle`` (on ``lock``) is notified after each pass
    of the writer (:meth:`pass_done`); ``_wake`` says something was queued, ``_hurry`` to
    write it without gathering more (a whole batch is queued, or a flush waits).
    """

    def __init__(self, max_pending: int, batch: int) -> None:
        self._max_pending = max_pending
        self._batch = batch
        # Plain tuples, which the garbage collector stops tracking.
        self.records: deque[tuple[Any, ...]] = deque()
        self.outcomes: deque[QueuedOutcome] = deque()
        self.loads: deque[ScaleLoad] = deque()  # a few a run: never dropped
        self.gaps: list[Gap] = []
        self.in_flight = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self._idle = threading.Condition(self.lock)
        self._wake = threading.Event()
        self._hurry = threading.Event()

    def put(self, samples: list[StepSample]) -> None:
        """Called by the recorder thread; never blocks on the store."""
        records = self.records
        with self.lock:
            for sample in samples:
                record = sample.record
                if record.params:
                    records.append(Diagnosed(step_values(record), finding_rows([record])))
                else:
                    records.append(step_values(record))
                for outcome in sample.controls:
                    self.outcomes.append(
                        QueuedOutcome(sample.record.step, sample.record.wall_time, outcome)
                    )
            # The batch being written counts: it may fail and come back.
            overflow = len(records) + self.in_flight - self._max_pending
            for _ in range(min(max(0, overflow), len(records))):
                self._drop(records.popleft()[0])
            full = len(records) >= self._batch
        if full:
            self._hurry.set()
        self._wake.set()

    def put_outcome(self, outcome: QueuedOutcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)
        self._wake.set()

    def put_load(self, load: ScaleLoad) -> None:
        """A scale load the training thread noted; written before the records queued with it."""
        with self.lock:
            self.loads.append(load)
        self._wake.set()

    # ------------------------------------------------ the writer's side

    def wait_for_work(self, idle_s: float, coalesce_s: float) -> None:
        """The writer's wait before a pass: up to ``idle_s`` for something queued, then up
        to ``coalesce_s`` for more to gather, unless a whole batch or a flush hurries it."""
        if self._wake.wait(idle_s):
            self._hurry.wait(coalesce_s)
        self._wake.clear()
        self._hurry.clear()

    def pass_done(self) -> None:
        """The writer has made a pass: those waiting in :meth:`hurry` look again."""
        with self.lock:
            self._idle.notify_all()

    # ------------------------------------------------ flush and close

    def pending(self) -> bool:
        """Whether something is queued or being written."""
        with self.lock:
            return self._busy()

    def hurry(self, wait: float = 0.0) -> None:
        """Have the writer write what is queued now, without gathering more; and wait up to
        ``wait`` seconds for its pass, if something is left to write."""
        with self.lock:
            if not self._busy():
                return
            self._hurry.set()
            self._wake.set()
            if wait > 0:
                self._idle.wait(wait)

    def wake_writer(self) -> None:
        """Have the writer look at once (it is told to stop, say), busy or not."""
        self._hurry.set()
        self._wake.set()

    def drop_unwritten(self) -> int:
        """Count what is queued or being written as dropped (at close); returns how many."""
        with self.lock:
            unwritten = self._unwritten()
            self.dropped += unwritten
        return unwritten

    def unwritten(self) -> int:
        """Records queued or being written."""
        with self.lock:
            return self._unwritten()

    def _drop(self, step: int) -> None:
        self.dropped += 1
        if self.gaps and self.gaps[-1][1] + 1 == step:
            first, _, count = self.gaps[-1]
            self.gaps[-1] = (first, step, count + 1)
        else:
            self.gaps.append((step, step, 1))

    def take(self) -> tuple[list[tuple[Any, ...]], list[QueuedOutcome]]:
        """The next batch of records (it leaves the queue) and every queued outcome.

        Records dropped while the batch is written are never ones that reach the store;
        :meth:`put_back` returns the batch to the front if the write fails.
        """
        records = self.records
        with self.lock:
            batch = [records.popleft() for _ in range(min(self._batch, len(records)))]
            outcomes = list(self.outcomes)
            self.in_flight = len(batch) + len(outcomes)
        return batch, outcomes

    def put_back(self, batch: list[tuple[Any, ...]], gaps: list[Gap]) -> None:
        """A batch whose write failed, and the gaps that were lost with it, to the front."""
        with self.lock:
            self.records.extendleft(reversed(batch))
            self.gaps[:0] = gaps

    def first_load(self) -> ScaleLoad | None:
        """The oldest scale load not yet written, left queued until :meth:`load_written`."""
        with self.lock:
            return self.loads[0] if self.loads else None

    def load_written(self) -> None:
        with self.lock:
            self.loads.popleft()

    def outcome_written(self) -> None:
        with self.lock:
            self.outcomes.popleft()

    def written(self) -> None:
        with self.lock:
            self.in_flight = 0

    def has_gaps(self) -> bool:
        with self.lock:
            return bool(self.gaps)

    def take_gaps(self) -> list[Gap]:
        with self.lock:
            gaps, self.gaps = joined(self.gaps), []
        return gaps

    def first_wall_time(self) -> float | None:
        """The wall time of the oldest record queued, if any."""
        with self.lock:
            return self.records[0][1] if self.records else None

    def _busy(self) -> bool:
        """Something is queued or being written; call with ``lock`` held."""
        return bool(self.records or self.outcomes or self.loads or self.gaps or self.in_flight)

    def _unwritten(self) -> int:
        """Records queued or being written; call with ``lock`` held."""
        return len(self.records) + self.in_flight


def joined(gaps: list[Gap]) -> list[Gap]:
    """``gaps`` in step order, ranges that touch joined into one.

    A batch whose write failed goes back to the front of the queue; when it is dropped
    after records that came in while it was being written, its steps open a second range
    right before the first.

    >>> joined([(4, 6, 3), (1, 3, 3), (9, 9, 1)])
    [(1, 6, 6), (9, 9, 1)]
    """
    result: list[Gap] = []
    for first, last, count in sorted(gaps):
        if result and result[-1][1] + 1 == first:
            start, _, before = result[-1]
            result[-1] = (start, last, before + count)
        else:
            result.append((first, last, count))
    return result
