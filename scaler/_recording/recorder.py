"""Per-step snapshots taken on the training thread, read on a background thread.

The training thread copies a step's values into a reused host row (on cuda an
asynchronous copy to pinned memory); the recorder thread reads the rows into samples,
folds the statistics and hands the samples to a sink (the telemetry writer).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._agreement.payload import Attribution, overflowed_ranks
from .._control import ControlOutcome
from .._grad_norm import named_norms
from .._step_sample import StepSample, record_of
from ..stats import ScalerStats
from .learning_rates import Rates
from .step_values import Captured, StepValues

if TYPE_CHECKING:
    from .._diagnosis.findings import Diagnosis
    from ..store.records import StepRecord

log = logging.getLogger("scalewatch")

# The defaults of a Recorder's tunables (its keyword arguments).
MAX_PENDING = 65536
POLL_S = 0.05
# Snapshots read between hand-offs of the GIL (~0.1 ms of reading). Every 256 switched the
# training thread out less often but measured worse with telemetry on (bench/telemetry.py,
# bench/multirank.py's scaler cpu rows): it waited longer for the GIL each time.
YIELD_EVERY = 32
INLINE_BATCH = 256


@dataclass(kw_only=True, slots=True)
class Snapshot:
    """One ``update()`` as the training thread hands it over; its values may be on their way.

    Made every step: see :func:`make` for how.
    """

    step: int
    wall_time: float
    captured: Captured | StepValues  # StepValues: a cpu step's, read at once (``read_cpu``)
    attribution: Attribution  # whose flags the step's payloads carry
    scale_used: float | None  # known on the host (first step, after a load or a new_scale)
    stepped: bool
    growth_interval: int
    growth_factor: float
    backoff_factor: float
    control_version: int
    scale_set: bool  # the scale was set this step (new_scale or control), not grown/backed off
    controls: tuple[ControlOutcome, ...] = ()
    diagnosis: Diagnosis | None = None  # an overflow explained (on the reporting rank)
    # Each optimizer's param groups' rates in effect at step(), as read there: the record's
    # lr and lr_groups are made of them on the recorder thread (``step_rates``).
    rates: tuple[Rates, ...] = ()
    # Registered schedulers' steps since the last update: (before, after) this step's
    # optimizers stepped (see _schedules.Schedules.take); None when none is registered.
    schedule: tuple[int, int] | None = None
    # With grad_norm: the parameters the largest norms' positions index, and how to name them.
    top_of: tuple[list[Any], Callable[[Any], object]] | None = None


Sink = Callable[[list[StepSample]], None]

# A keyword-only dataclass made every step (``Snapshot``, ``StepRecord``) is made as
# ``obj = make(cls)`` then ``cls.__init__(obj, field=...)``: calling the class with keywords
# packs them into a dict on the way to ``__init__`` (``type.__call__``), which took twice as
# long as positional arguments; ``__init__`` called itself takes them as fast.
make = object.__new__


@dataclass(slots=True)
class Counts:
    """A scaler's running counts, kept as plain fields: a new ScalerStats per step costs
    the GIL. The training thread adds a clean cpu step's itself (``Recorder.counts``)."""

    last_scale: float | None = None
    steps: int = 0
    skipped: int = 0
    overflows: int = 0
    growths: int = 0
    backoffs: int = 0
    current: float = 0.0
    low: float = float("inf")
    high: float = 0.0
    last_skipped: bool = False  # the step before, for a scheduler stepped after it
    drift: int = 0  # skipped steps on which a registered scheduler stepped
    spike_skips: int = 0  # steps skipped for a spike

    def stats(self, dropped: int) -> ScalerStats:
        return ScalerStats(
            steps=self.steps,
            skipped=self.skipped,
            overflows=self.overflows,
            growths=self.growths,
            backoffs=self.backoffs,
            current_scale=self.current,
            min_scale_seen=self.low,
            max_scale_seen=self.high,
            dropped_records=dropped,
            spike_skips=self.spike_skips,
        )

    def add(
        self,
        scale_used: float | None,
        scale_after: float,
        overflow: bool,
        stepped: bool,
        scale_set: bool,
        spiked: bool = False,
    ) -> float:
        """Count one step; returns the scale it used (``scale_used``, or the last one seen).
        ``spiked``: its optimizers were skipped for a spike (it did not overflow)."""
        used = scale_used if scale_used is not None else self.last_scale
        if used is None:
            used = scale_after
        self.steps += 1
        self.skipped += (overflow or spiked) and stepped
        self.spike_skips += spiked and stepped
        self.overflows += overflow
        self.growths += not scale_set and scale_after > used
        self.backoffs += not scale_set and scale_after < used
        self.current = scale_after
        self.low = min(self.low, used, scale_after)
        self.high = max(self.high, used, scale_after)
        self.last_scale = scale_after
        return used

    def step(
        self,
        scale_used: float | None,
        scale_after: float,
        overflow: bool,
        stepped: bool,
        scale_set: bool,
        schedule: tuple[int, int] | None,
        spiked: bool = False,
    ) -> tuple[float, bool, int | None]:
        """Count one step: (the scale it used, whether it was skipped, the schedule's
        drift so far, None without a registered scheduler)."""
        skipped_before = self.last_skipped
        skipped = self.last_skipped = (overflow or spiked) and stepped
        used = self.add(scale_used, scale_after, overflow, stepped, scale_set, spiked)
        drift = None if schedule is None else self.drifted(schedule, skipped_before, skipped)
        return used, skipped, drift

    def drifted(self, schedule: tuple[int, int], skipped_before: bool, skipped: bool) -> int:
        """Add a step's scheduler calls that went to a skipped step; the drift so far."""
        before, after = schedule
        self.drift += (before if skipped_before else 0) + (after if skipped else 0)
        return self.drift


class Recorder:
    """Takes snapshots from the training thread; one daemon thread reads them.

    The thread wakes every ``poll_s`` and reads what has queued, rather than being
    woken per step: a wake-up per step costs the training thread more than the work.
    Past ``max_pending`` unread snapshots a step is dropped and counted; the thread hands
    the GIL back every ``yield_every`` snapshots read; without a thread the training
    thread folds ``inline_batch`` steps at once.
    """

    def __init__(
        self,
        init_scale: float,
        sink: Sink | None = None,
        previous: Recorder | None = None,
        *,
        max_pending: int = MAX_PENDING,
        poll_s: float = POLL_S,
        yield_every: int = YIELD_EVERY,
        inline_batch: int = INLINE_BATCH,
    ) -> None:
        self._max_pending = max_pending
        self._yield_every = yield_every
        self._inline_batch = inline_batch
        self._pending: deque[Snapshot] = deque()
        self._cond = threading.Condition()
        counts = Counts(last_scale=init_scale) if previous is None else previous.counts
        self.counts: Counts = counts
        self._submitted = 0
        self._done = 0
        self._dropped: int = previous._dropped if previous is not None else 0
        self._sink = sink
        self._closed = False
        self._thread: threading.Thread | None = None
        if sink is not None:
            self._thread = threading.Thread(
                target=_run,
                args=(weakref.ref(self), self._cond, poll_s),
                name="scalewatch-recorder",
                daemon=True,
            )
            self._thread.start()

    def submit(self, snap: Snapshot) -> None:
        """Never blocks: past ``max_pending`` unread snapshots the step is dropped and counted.

        Without a sink (telemetry off, or a rank that does not report) there is no thread:
        the training thread folds the steps whose values have arrived, every
        ``inline_batch`` steps, which costs it less than a thread's wake-ups and GIL
        hand-offs.
        """
        if len(self._pending) >= self._max_pending:
            self._dropped += 1
            if isinstance(snap.captured, Captured):
                snap.captured.discard()
            return
        self._pending.append(snap)
        self._submitted += 1
        if self._thread is None and len(self._pending) >= self._inline_batch:
            with self._cond:
                self._drain(arrived_only=True)

    @property
    def folds_inline(self) -> bool:
        """Whether a step's values can be folded as they come: no sink will read its record
        (telemetry off, or a rank that does not report) and no step waits before it."""
        return self._thread is None and not self._pending and not self._closed

    def fold(
        self,
        scale_used: float | None,
        scale_after: float,
        overflow: bool,
        stepped: bool,
        scale_set: bool,
        spiked: bool = False,
    ) -> None:
        """Count a cpu step where ``folds_inline``: what a snapshot of it would count,
        without the snapshot."""
        self.counts.add(scale_used, scale_after, overflow, stepped, scale_set, spiked)
        self._submitted += 1
        self._done += 1

    def fold_step(
        self,
        scale_used: float | None,
        scale_after: float,
        overflow: bool,
        stepped: bool,
        scale_set: bool,
        schedule: tuple[int, int] | None,
        spiked: bool = False,
    ) -> tuple[float, bool, int | None]:
        """Count a cpu step where ``folds_inline`` for a telemetry that takes its row
        from the training thread: (the scale it used, skipped, the schedule's drift)."""
        self._submitted += 1
        self._done += 1
        counts = self.counts
        return counts.step(scale_used, scale_after, overflow, stepped, scale_set, schedule, spiked)

    def stats(self, timeout: float = 30.0) -> ScalerStats:
        self.flush(timeout)
        with self._cond:
            return self.counts.stats(self._dropped)

    def flush(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._thread is None:
                self._drain()
                return
            self._cond.notify()
            while self._done < self._submitted:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("telemetry recorder did not catch up")
                self._cond.wait(min(left, 0.05))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that reads the steps; None without a sink (the caller's thread does)."""
        return self._thread

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join(timeout=10)

    def _drain(self, arrived_only: bool = False) -> bool:
        """Read every pending snapshot (``arrived_only``: up to the first whose values are
        still on their way, which waiting for would be a sync); False once closed and empty."""
        batch: list[StepSample] = []
        popped = 0
        threaded = self._thread is not None
        while self._pending:
            head = self._pending[0].captured
            if arrived_only and isinstance(head, Captured) and not head.arrived():
                break
            snap = self._pending.popleft()
            popped += 1
            if threaded and popped % self._yield_every == 0:
                time.sleep(0)  # hand the GIL to the training thread rather than make it wait
            try:
                sample = _materialise(snap, self.counts, sample=self._sink is not None)
            except Exception:  # a broken snapshot must not stop the thread
                log.exception("scalewatch: could not read step %d", snap.step)
                sample = None
            if sample is not None:
                batch.append(sample)
        if batch and self._sink is not None:
            try:
                self._sink(batch)
            except Exception:
                log.exception("scalewatch: telemetry sink failed")
        with self._cond:
            self._done += popped
            self._cond.notify_all()
            return not (self._closed and not self._pending)


def _run(ref: weakref.ref[Recorder], cond: threading.Condition, poll_s: float) -> None:
    while True:
        recorder = ref()
        if recorder is None:
            return
        if not recorder._drain():
            return
        pending = bool(recorder._pending)
        del recorder
        if not pending:
            with cond:
                cond.wait(poll_s)


def _materialise(snap: Snapshot, fold: Counts, sample: bool = True) -> StepSample | None:
    """Fold ``snap`` into ``fold``; returns its sample, unless ``sample`` is False (no sink).

    Read on the recorder thread for every step: a clean step (the common one) takes the
    shortest way, with no payload to split, since no rank's flag is set in it.
    """
    captured = snap.captured
    values = captured.read() if isinstance(captured, Captured) else captured
    scale_after, tracker, found, loss, payloads, norm, top, spiked = values
    overflow = found > 0
    used, skipped, drift = fold.step(
        snap.scale_used, scale_after, overflow, snap.stepped, snap.scale_set, snap.schedule, spiked
    )
    if not sample:
        return None
    record = record_of(
        (
            snap.step,
            snap.wall_time,
            used,
            overflow,
            skipped,
            inf_ranks(snap.attribution, overflow, payloads),
            scale_after,
            tracker,
            snap.growth_interval,
            snap.growth_factor,
            snap.backoff_factor,
            snap.control_version,
            loss,
            snap.rates,
            drift,
            norm,
            () if top is None or snap.top_of is None else named_norms(top, *snap.top_of),
            spiked and snap.stepped,
        )
    )
    return StepSample(with_diagnosis(record, snap.diagnosis), snap.controls)


def with_diagnosis(record: StepRecord, diagnosis: Diagnosis | None) -> StepRecord:
    """``record`` with what the diagnosis of its overflow found, if one was made."""
    if diagnosis is None:
        return record
    return dataclasses.replace(
        record,
        loss_nonfinite_ranks=diagnosis.loss_nonfinite_ranks,
        params=diagnosis.params,
        params_omitted=diagnosis.omitted,
    )


def inf_ranks(
    attribution: Attribution, overflow: bool, payloads: Sequence[list[float]]
) -> tuple[int, ...]:
    """The ranks whose gradients held inf/NaN; () where the ranks are not known
    (GradScaler in a process group)."""
    if not overflow or not attribution.known:
        return ()
    if not attribution.ranks or not payloads:
        return (0,)
    if len(payloads) == 1:
        return overflowed_ranks(payloads[0])
    # several optimizers: a rank flagged by any of them
    return tuple(sorted({rank for row in payloads for rank in overflowed_ranks(row)}))
