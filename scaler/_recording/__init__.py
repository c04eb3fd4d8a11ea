"""Each step's values from the device to the host, on every rank; a scaler's link to its run.

On every rank the training thread snapshots a step at ``update()``: a cpu step's values
are read at once (``step_values.read_cpu``: no sync), a cuda step's copied asynchronously
into a reused pinned row (``step_values``, ``pinned_rows``). On the reporting rank with
telemetry on, the recorder thread (``recorder``) reads the rows, folds ``stats()`` and
hands the samples to :mod:`scalewatch.telemetry`; elsewhere there is no thread, and the
training thread folds the steps in batches.

``RunLink``, here, is what a scaler holds only while it trains, never pickled: the
recorder that reads each step's values, the telemetry they feed on the reporting rank,
the finalizer that closes both, the control requests waiting for a step, and the
host-side values of the step in progress. A copy of a scaler (pickle, deepcopy) gets a
new link, and so a run of its own.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._control import ControlOutcome, ControlUpdate
from ..stats import ScalerStats
from ..store.records import ScaleLoad
from .learning_rates import Rates
from .pinned_rows import PinnedRings
from .recorder import Recorder, Sink, Snapshot
from .skips import Skips

if TYPE_CHECKING:
    import torch

    from .._schedules import Schedules
    from ..telemetry import Telemetry


class RunLink:
    """The transient half of a scaler: one attribute, so a copy can leave all of it behind."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None
        self.telemetry: Telemetry | None = None
        self.closer: weakref.finalize[Any, Any] | None = None
        self.pinned = PinnedRings()
        self.inbox: deque[ControlUpdate] = deque()
        self.code_outcomes: list[ControlOutcome] = []
        self.scale_host: float | None = None  # the scale, where the host knows it
        self.last_found: torch.Tensor | None = None
        self.group: tuple[int, int] | None = None
        self.last_run_id: int | None = None
        self.closed_dropped = 0  # records that earlier telemetry of this scaler lost
        # (scale, its version, 1/scale): the inverse kept while the scale is unchanged
        self.inverse: tuple[torch.Tensor, int, torch.Tensor] | None = None
        self.rates: list[Rates] = []  # this step's learning rates, optimizer by optimizer
        self.skips = Skips()
        # A load of the scaler's state for the telemetry that the next step opens (a run
        # resumed by a scaler that has not stepped in it): see _state.note_load.
        self.pending_load: ScaleLoad | None = None
        self.schedules: Schedules | None = None  # the LR schedulers registered, if any

    def inverse_of(self, scale: torch.Tensor) -> torch.Tensor:
        """``1 / scale`` as torch's unscale_ takes it (in float64, rounded once to float32:
        float32 division can be imprecise under some compile options), taken again only
        when the scale has changed since.

        Every in-place change of a tensor (the update's, ``fill_``, ``copy_``) bumps its
        version, which the host keeps: telling a changed scale costs no device read.
        """
        if scale.device.type == "mps":  # as torch's: mps has no float64
            return scale.reciprocal()
        kept = self.inverse
        try:
            version = scale._version
        except RuntimeError:  # an inference-mode tensor keeps no version: not kept
            return scale.double().reciprocal().float()
        if kept is not None and kept[0] is scale and kept[1] == version:
            return kept[2]
        inverse = scale.double().reciprocal().float()
        self.inverse = (scale, version, inverse)
        return inverse

    def submit(
        self, owner: object, snapshot: Snapshot, init_scale: float, make_sink: Callable[[], Any]
    ) -> None:
        """Hand ``snapshot`` to the recorder, opening one (and the run) at the first step."""
        recorder = self.recorder
        if recorder is None or recorder.closed:
            sink: Sink | None = make_sink()
            recorder = self.recorder = Recorder(init_scale, sink, recorder)
            self._close_when_dropped(owner, recorder)
        recorder.submit(snapshot)

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


def _close_parts(recorder: Recorder, telemetry: Telemetry | None) -> None:
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
