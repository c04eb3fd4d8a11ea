"""What every mirror is: a tracker that takes batches of steps, and the steps it takes.

A mirror is made by the user (or from ``$SCALEWATCH_MIRROR``) on any rank, checks there that
its library is installed, and touches no tracker until the reporting rank's run opens:
:meth:`Mirror.attach` runs then on the training thread (cheap look-ups only, such as the
tracker's active run), and every other call on the mirror's own thread (``_feed``).
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .._step_sample import StepSample, record_of
from ..store.step_schema import MIRRORED, StepRecord

PREFIX = "scalewatch/"
_LOGGED = tuple((f.name, PREFIX + f.mirror_name, f.finite_only) for f in MIRRORED)


@dataclass(frozen=True, slots=True)
class MirroredStep:
    """One step as the trackers log it: its number, when, and its values by name.

    >>> from scalewatch.store.records import StepRecord
    >>> record = StepRecord(step=3, wall_time=1.5, scale=1024.0, overflow=False,
    ...     skipped=False, inf_ranks=(), scale_after=1024.0, growth_tracker=3,
    ...     growth_interval=2000, growth_factor=2.0, backoff_factor=0.5, control_version=0,
    ...     lr=0.1)
    >>> step = mirrored(record)
    >>> step.step, step.values["scalewatch/loss_scale"], step.values["scalewatch/learning_rate"]
    (3, 1024.0, 0.1)
    >>> "scalewatch/loss" in step.values  # no loss recorded: not logged
    False
    """

    step: int
    wall_time: float
    values: dict[str, float]


def mirrored(record: StepRecord) -> MirroredStep:
    """``record`` as a mirror logs it: each field of the step schema's :data:`MIRRORED`
    that has a value (a loss that is not finite is left out, as the store leaves it)."""
    values = {}
    for name, key, finite_only in _LOGGED:
        value = getattr(record, name)
        if value is None:
            continue
        value = float(value)
        if finite_only and not math.isfinite(value):
            continue
        values[key] = value
    return MirroredStep(record.step, record.wall_time, values)


def steps_of(items: Iterable[Any]) -> list[MirroredStep]:
    """The steps among what a run's telemetry was handed (rows in ``TrainingRow``'s order
    and :class:`StepSample`; markers, loads and gaps are not steps)."""
    steps = []
    for item in items:
        kind = type(item)
        if kind is tuple:
            steps.append(mirrored(record_of(item)))
        elif kind is StepSample:
            steps.append(mirrored(item.record))
    return steps


@dataclass(frozen=True, slots=True)
class RunLinks:
    """What a tracker's run is told of the scalewatch run it mirrors."""

    uid: str
    run_id: int | None
    page: str | None  # the run's page on the dashboard, where its address is known

    def as_tags(self) -> dict[str, str]:
        tags = {PREFIX + "run_uid": self.uid}
        if self.run_id is not None:
            tags[PREFIX + "run_id"] = str(self.run_id)
        if self.page is not None:
            tags[PREFIX + "run_page"] = self.page
        return tags


def require(module: str, extra: str, who: str) -> ModuleType:
    """``module`` imported, or an ImportError in one line naming the extra that installs it.

    >>> require("no_such_tracker", "tracker", "scalewatch.mirrors.Tracker")
    Traceback (most recent call last):
    ...
    ImportError: scalewatch.mirrors.Tracker needs no_such_tracker: pip install scalewatch[tracker]
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        message = f"{who} needs {module}: pip install scalewatch[{extra}]"
        raise ImportError(message) from None


class Mirror(ABC):
    """A tracker that shows each step's values beside the user's own (TensorBoard, MLflow,
    W&B, or a subclass of one's own): given to a scaler's ``mirrors=``.

    Only the reporting rank's mirrors write. A write that raises loses that batch in the
    tracker, never a scalewatch record: the failures are counted in :attr:`failures`, and
    the first is logged.
    """

    name = "mirror"  # as a log line names it
    interval_s = 1.0  # how often its thread writes a batch of the steps that came

    def __init__(self) -> None:
        self.failures = 0  # writes that raised
        self.dropped = 0  # steps not written: in a failed write, or not taken in time

    def attach(self) -> None:  # noqa: B027 (a mirror may have nothing to look up)
        """On the training thread, as the run opens: look up what only that thread can see
        (an MLflow run is active in a thread). Cheap: no tracker is written to here."""

    @abstractmethod
    def write(self, steps: list[MirroredStep]) -> None:
        """Log ``steps`` (in step order); on the mirror's own thread."""

    @abstractmethod
    def describe(self, links: RunLinks) -> None:
        """Tell the tracker's run which scalewatch run it mirrors (tags, config, text);
        once, on the mirror's own thread, when the store has given the run its id."""

    def close(self) -> None:  # noqa: B027 (a mirror may have nothing to flush)
        """Flush, and end what the mirror itself started; on the mirror's own thread."""
