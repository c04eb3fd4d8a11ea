"""Each step's values from the device to the host, on every rank; a scaler's run session.

On every rank the training thread snapshots a step at ``update()``: a cpu step's values
are read at once (``step_values.read_cpu``: no sync), a cuda step's copied asynchronously
into a reused pinned row (``step_values``, ``pinned_rows``). On the reporting rank with
telemetry on, the recorder thread (``recorder``) reads the rows, folds ``stats()`` and
hands the samples to :mod:`scalewatch.telemetry`; elsewhere there is no thread, and the
training thread folds the steps in batches.

A scaler holds three transient objects, never pickled, each one concern: the step in
progress (``step_context.StepContext``), the control inbox (``_control.inbox``), and,
here, ``RunSession``: the recorder that reads each step's values, the telemetry they feed
on the reporting rank (made by the factory the session was given), the finalizer that
closes both, and what outlives one telemetry (its run id, what it dropped, a load waiting
for the next one). A copy of a scaler (pickle, deepcopy) gets new ones, and so a run of
its own.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._control.inbox import ControlInbox
from .._step_sample import StepSample
from ..stats import ScalerStats
from ..store.records import ScaleLoad
from .recorder import Recorder


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOpening:
    """What the reporting rank's telemetry is opened with, at the scaler's first step."""

    target: Any  # a store URL, a Store, TelemetrySettings, or None: the default store
    name: str | None
    world_size: int
    config: Mapping[str, Any]
    control: Mapping[str, Any]
    uid: str | None  # the run to continue (a loaded state dict's), or None: a new run
    scale_load: ScaleLoad | None = None  # a load noted before this telemetry existed
    mirrors: tuple[Any, ...] = ()  # scalewatch.mirrors.Mirror: trackers it also logs to


class RunTelemetry(Protocol):
    """What a session asks of its run's telemetry (:class:`scalewatch.telemetry.Telemetry`)."""

    @property
    def uid(self) -> str | None: ...
    @property
    def run_id(self) -> int | None: ...
    @property
    def dropped(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def threads(self) -> tuple[threading.Thread, ...]: ...
    @property
    def add_row(self) -> Callable[[tuple[Any, ...]], None] | None:
        """Takes a cpu step's row from the training thread, or None: samples only."""

    def submit(self, samples: list[StepSample]) -> None: ...
    def note_scale_load(self, load: ScaleLoad) -> None: ...
    def flush(self, timeout: float = 30.0) -> bool: ...
    def close(self) -> None: ...


TelemetryFactory = Callable[[RunOpening, ControlInbox], RunTelemetry]


def open_telemetry(opening: RunOpening, inbox: ControlInbox) -> RunTelemetry:
    """The default factory: a writer into the store ``opening`` names."""
    from ..telemetry import open_run  # the store's engine, loaded by a reporting rank only

    return open_run(
        opening.target,
        name=opening.name,
        world_size=opening.world_size,
        config=opening.config,
        control=opening.control,
        inbox=inbox,
        uid=opening.uid,
        scale_load=opening.scale_load,
        mirrors=opening.mirrors,
    )


class RunSession:
    """The recorder and telemetry of a scaler's run, opened at its first step."""

    def __init__(self, inbox: ControlInbox, make_telemetry: TelemetryFactory = open_telemetry):
        self._inbox = inbox
        self._make_telemetry = make_telemetry
        self.recorder: Recorder | None = None
        self.telemetry: RunTelemetry | None = None
        self.closer: weakref.finalize[Any, Any] | None = None
        self.last_run_id: int | None = None
        self.closed_dropped = 0  # records that earlier telemetry of this scaler lost
        # A load of the scaler's state for the telemetry that the next step opens (a run
        # resumed by a scaler that has not stepped in it): see _checkpoint_state.note_load.
        self.pending_load: ScaleLoad | None = None
        # Where a cpu step's row goes, from the training thread (a telemetry that takes
        # rows, with no recorder thread between); None: a snapshot to the recorder.
        self.add_row: Callable[[tuple[Any, ...]], None] | None = None

    @property
    def is_open(self) -> bool:
        """Whether a recorder takes steps (else the next step opens one)."""
        recorder = self.recorder
        return recorder is not None and not recorder.closed

    def open(
        self, owner: object, init_scale: float, opening: RunOpening | None, *, on_cpu: bool
    ) -> str | None:
        """Start a recorder, with telemetry made from ``opening`` on the reporting rank
        (None elsewhere, or with telemetry off); returns the run's uid if one is written.

        A cpu step's values are on the host at once: with a telemetry that takes rows, the
        training thread hands them over itself and no recorder thread runs (``add_row``).
        """
        telemetry = None
        if opening is not None:
            load, self.pending_load = self.pending_load, None
            opening = dataclasses.replace(opening, scale_load=load)
            telemetry = self.telemetry = self._make_telemetry(opening, self._inbox)
        self.add_row = None if telemetry is None or not on_cpu else telemetry.add_row
        sink = None if telemetry is None or self.add_row is not None else telemetry.submit
        recorder = self.recorder = Recorder(init_scale, sink, self.recorder)
        self._close_when_dropped(owner, recorder)
        return None if telemetry is None else telemetry.uid

    def _close_when_dropped(self, owner: object, recorder: Recorder) -> None:
        """Close ``recorder`` and its telemetry when ``owner`` is garbage-collected or at
        interpreter exit, whichever comes first: a scaler that is a local of a training
        function and never closed still has every step written and its run finished.
        """
        if self.closer is not None:
            self.closer.detach()
        self.closer = weakref.finalize(owner, _close_parts, recorder, self.telemetry)

    @property
    def run_id(self) -> int | None:
        return self.last_run_id if self.telemetry is None else self.telemetry.run_id

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if self.recorder is not None:
            try:
                self.recorder.flush(timeout)
            except TimeoutError:
                return False
        if self.telemetry is None:
            return True
        return bool(self.telemetry.flush(max(0.0, deadline - time.monotonic())))

    def stats(self, timeout: float) -> ScalerStats | None:
        """The recorder's counts with every lost record; None before the first step."""
        if self.recorder is None:
            return None
        stats = self.recorder.stats(timeout)
        lost = self.closed_dropped
        if self.telemetry is not None:
            lost += self.telemetry.dropped
        return dataclasses.replace(stats, dropped_records=stats.dropped_records + lost)

    def close(self) -> None:
        closer, telemetry = self.closer, self.telemetry
        self.telemetry = None
        if closer is not None:
            closer()  # does nothing once done
        if telemetry is not None:
            self.last_run_id = telemetry.run_id
            self.closed_dropped += telemetry.dropped


def _close_parts(recorder: Recorder, telemetry: RunTelemetry | None) -> None:
    """Close a scaler's recorder and telemetry (the finalizer of a dropped or exiting scaler).

    The garbage collector may run it on one of their own threads, which cannot wait for
    itself: then a thread of its own does it.
    """
    own = {recorder.thread, *(() if telemetry is None else telemetry.threads)} - {None}
    if threading.current_thread() in own:
        threading.Thread(
            target=_close_parts, args=(recorder, telemetry), name="scalewatch-closer"
        ).start()
        return
    recorder.close()
    if telemetry is not None:
        telemetry.close()
