"""Per-step snapshots taken on the training thread, read on a background thread.

The training thread copies a step's values into a reused host row (on cuda an
asynchronous copy to pinned memory); the recorder thread reads the rows into samples,
folds the statistics and hands the samples to a sink (the telemetry writer).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from ._pinned import PinnedRing, PinnedRings
from .stats import ScalerStats
from .store.records import StepRecord

log = logging.getLogger("scaler")

MAX_PENDING = 65536
POLL_S = 0.05
YIELD_EVERY = 32


class ControlSource(str, Enum):  # enum.StrEnum from Python 3.11; this runs on 3.10
    """Where a control change came from."""

    REQUEST = "request"  # a request in the store (the API or the CLI), ``request_id`` its id
    CODE = "code"  # a setter called by the training script: no request

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class ControlOutcome:
    """What happened to a control change at a step; ``request_id`` is None for ``CODE``."""

    source: ControlSource
    request_id: int | None
    values: dict[str, float | int]
    applied: bool
    reason: str | None
    state: dict[str, float | int | None]
    version: int

    def __post_init__(self) -> None:
        if (self.request_id is None) != (self.source is ControlSource.CODE):
            raise ValueError(f"a {self.source} change has request_id {self.request_id!r}")


@dataclass(frozen=True, slots=True)
class StepSample:
    """One ``update()`` as the host sees it, with the control changes made at it."""

    record: StepRecord
    controls: tuple[ControlOutcome, ...] = ()


class Captured:
    """Device values of one step: [scale, growth tracker, found_inf, *payload flags].

    They are copied to a row of ``rings``: on cuda asynchronously, to pinned memory.
    """

    __slots__ = ("_payloads", "_ring", "_row")

    def __init__(
        self,
        scale: torch.Tensor,
        tracker: torch.Tensor,
        found: torch.Tensor | None,
        flags: Sequence[torch.Tensor],
        rings: PinnedRings,
    ) -> None:
        self._payloads = len(flags)
        if found is None:
            found = scale.new_zeros(1)
        elif found.numel() != 1:
            found = found.reshape(-1)[:1]
        if scale.is_cuda:
            parts = [scale.reshape(1), tracker.reshape(1), found.reshape(1), *flags]
        else:  # a cpu row takes 0-d values as they are
            parts = [scale, tracker, found, *flags]
        sizes = (1, 1, 1, *[flag.numel() for flag in flags])  # scale, tracker, found_inf first
        self._ring: PinnedRing | None
        self._ring, self._row = rings.capture(parts, sizes)

    def discard(self) -> None:
        """Give the row back without reading it (the step was dropped)."""
        if self._ring is not None:
            self._ring.release(self._row)
            self._ring = None

    def read(self) -> tuple[float, int, float, list[float]]:
        """(scale, growth tracker, found_inf, flags of each rank summed over optimizers)."""
        assert self._ring is not None, "a step's values are read once"
        values = self._ring.read(self._row)
        self._ring = None
        return _split(values, self._payloads)


def _split(values: list[float], payloads: int) -> tuple[float, int, float, list[float]]:
    """A host row as ``read()`` returns it: the payloads that follow the first three summed."""
    flags = values[3:]
    if not payloads:
        return values[0], int(values[1]), values[2], []
    width = len(flags) // payloads
    summed = flags[:width]
    for start in range(width, len(flags), width):
        summed = [a + b for a, b in zip(summed, flags[start : start + width], strict=True)]
    return values[0], int(values[1]), values[2], summed


@dataclass(slots=True)
class Snapshot:
    step: int
    wall_time: float
    captured: Captured
    world_size: int  # rank flags in the payload; 0: single process; -1: not known
    scale_used: float | None  # known on the host (first step, after a load or a new_scale)
    stepped: bool
    growth_interval: int
    growth_factor: float
    backoff_factor: float
    control_version: int
    scale_set: bool  # the scale was set this step (new_scale or control), not grown/backed off
    controls: tuple[ControlOutcome, ...] = ()


Sink = Callable[[list[StepSample]], None]


@dataclass(slots=True)
class _Fold:
    """Running counts, kept as plain fields: a new ScalerStats per step costs the GIL."""

    last_scale: float | None = None
    steps: int = 0
    skipped: int = 0
    overflows: int = 0
    growths: int = 0
    backoffs: int = 0
    current: float = 0.0
    low: float = float("inf")
    high: float = 0.0

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
        )


class Recorder:
    """Takes snapshots from the training thread; one daemon thread reads them.

    The thread wakes every ``POLL_S`` and reads what has queued, rather than being
    woken per step: a wake-up per step costs the training thread more than the work.
    """

    def __init__(
        self, init_scale: float, sink: Sink | None = None, previous: Recorder | None = None
    ) -> None:
        self._pending: deque[Snapshot] = deque()
        self._cond = threading.Condition()
        self._fold: _Fold = previous._fold if previous is not None else _Fold(last_scale=init_scale)
        self._submitted = 0
        self._done = 0
        self._dropped: int = previous._dropped if previous is not None else 0
        self._sink = sink
        self._closed = False
        self._thread = threading.Thread(
            target=_run,
            args=(weakref.ref(self), self._cond),
            name="scalewatch-recorder",
            daemon=True,
        )
        self._thread.start()

    def submit(self, snap: Snapshot) -> None:
        """Never blocks: past MAX_PENDING unread snapshots the step is dropped and counted."""
        if len(self._pending) >= MAX_PENDING:
            self._dropped += 1
            snap.captured.discard()
            return
        self._pending.append(snap)
        self._submitted += 1

    def stats(self, timeout: float = 30.0) -> ScalerStats:
        self.flush(timeout)
        with self._cond:
            return self._fold.stats(self._dropped)

    def flush(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
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
    def thread(self) -> threading.Thread:
        return self._thread

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def _drain(self) -> bool:
        """Read every pending snapshot; False once closed and empty."""
        batch: list[StepSample] = []
        popped = 0
        while self._pending:
            snap = self._pending.popleft()
            popped += 1
            if popped % YIELD_EVERY == 0:
                time.sleep(0)  # hand the GIL to the training thread rather than make it wait
            try:
                sample = _materialise(snap, self._fold)
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


def _run(ref: weakref.ref[Recorder], cond: threading.Condition) -> None:
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
                cond.wait(POLL_S)


def _materialise(snap: Snapshot, fold: _Fold) -> StepSample:
    scale_after, tracker, found, flags = snap.captured.read()
    scale_used = snap.scale_used if snap.scale_used is not None else fold.last_scale
    if scale_used is None:
        scale_used = scale_after
    overflow = found > 0
    if snap.world_size > 0 and flags:
        inf_ranks = tuple(i for i, f in enumerate(flags[: snap.world_size]) if f > 0)
    elif snap.world_size < 0:
        inf_ranks = ()
    else:
        inf_ranks = (0,) if overflow else ()
    fold.steps += 1
    fold.skipped += overflow and snap.stepped
    fold.overflows += overflow
    fold.growths += not snap.scale_set and scale_after > scale_used
    fold.backoffs += not snap.scale_set and scale_after < scale_used
    fold.current = scale_after
    fold.low = min(fold.low, scale_used, scale_after)
    fold.high = max(fold.high, scale_used, scale_after)
    fold.last_scale = scale_after
    record = StepRecord(
        step=snap.step,
        wall_time=snap.wall_time,
        scale=scale_used,
        overflow=overflow,
        skipped=overflow and snap.stepped,
        inf_ranks=inf_ranks,
        scale_after=scale_after,
        growth_tracker=tracker,
        growth_interval=snap.growth_interval,
        growth_factor=float(snap.growth_factor),  # an int as torch keeps it: stored as float
        backoff_factor=float(snap.backoff_factor),
        control_version=snap.control_version,
    )
    return StepSample(record, snap.controls)
