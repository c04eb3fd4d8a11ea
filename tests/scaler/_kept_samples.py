"""A run's telemetry kept in memory: the samples a reporting rank's recorder hands over.

>>> import scalewatch
>>> gs = scalewatch.GradScaler("cpu")
>>> samples = keep_samples(gs)
>>> samples
[]
"""

from __future__ import annotations

import threading
from typing import Any

from scalewatch._control.inbox import ControlInbox
from scalewatch._recording import RunOpening, RunSession
from scalewatch._step_sample import StepSample
from scalewatch.store.records import ScaleLoad


class KeptSamples:
    """The telemetry of a run that writes no store: ``samples`` gets what it is handed."""

    uid: str | None = None
    run_id: int | None = None
    dropped = 0
    threads: tuple[threading.Thread, ...] = ()
    add_row = None  # samples from the recorder, cpu steps too

    def __init__(self, samples: list[StepSample]) -> None:
        self.samples = samples
        self.closed = False

    def submit(self, samples: list[StepSample]) -> None:
        self.samples.extend(samples)

    def note_scale_load(self, load: ScaleLoad) -> None:
        pass

    def flush(self, timeout: float = 30.0) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


class EveryRankSession(RunSession):
    """A session that opens telemetry on every rank, not only the reporting one: a test
    compares what each rank's recorder read."""

    def open(
        self, owner: object, init_scale: float, opening: RunOpening | None, *, on_cpu: bool
    ) -> str | None:
        if opening is None:
            opening = RunOpening(
                target=None, name=None, world_size=1, config={}, control={}, uid=None
            )
        return super().open(owner, init_scale, opening, on_cpu=on_cpu)


def keep_samples(scaler: Any) -> list[StepSample]:
    """Give ``scaler`` a session whose telemetry, on every rank, keeps its samples in the
    list returned."""
    samples: list[StepSample] = []

    def make(opening: RunOpening, inbox: ControlInbox) -> KeptSamples:
        return KeptSamples(samples)

    scaler._session = EveryRankSession(scaler._inbox, make)
    return samples
