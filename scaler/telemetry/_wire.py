"""What the training process and its telemetry writer process say to each other.

Both ends of one connection (``multiprocessing.connection``), each message a pickled
tuple whose first element is its kind. To the writer process (``_remote`` sends them):
``("items", key, [item, ...])``, what a run handed over in its order; an item is a step's
row (a plain tuple in ``TrainingRow``'s order), a
:class:`~scalewatch._step_sample.StepSample`, a :class:`~scalewatch.store.records.ScaleLoad`,
a :class:`~scalewatch.telemetry._queue.RecordGap`, or a :class:`Marker`: the run opened
(``OpenRun``), a :class:`Flush` or a :class:`Close`, each in its place among the steps.
Back (``_host`` sends them): ``("state", key, RunState)``, ``("control", key,
ControlUpdate)``, ``("done", token, ok, RunState)``, ``("log", fields)`` (a log record's
fields, logged again there).

Imports no torch and no store: both ends load it.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

PROTOCOL = pickle.HIGHEST_PROTOCOL


class Marker(NamedTuple):
    """An item that is not a step: ``"open"`` (an :class:`OpenRun`), ``"flush"`` (a
    :class:`Flush`) or ``"close"`` (a :class:`Close`)."""

    kind: str
    body: Any


@dataclass(frozen=True, slots=True)
class OpenRun:
    """A run for the writer process to write: what ``Telemetry`` is made with."""

    settings: Any  # TelemetrySettings, naming a store by URL
    name: str | None
    world_size: int
    config: Mapping[str, Any]
    control: Mapping[str, Any]
    uid: str
    resume: bool  # continue the stored run ``uid``; else a new run of that uid
    started_at: float


@dataclass(frozen=True, slots=True)
class Flush:
    """Answer ``token`` once what came before is written (or ``timeout`` passes)."""

    token: int
    timeout: float


@dataclass(frozen=True, slots=True)
class Close:
    """Write what came before, end the run as ``status``, answer ``token``."""

    token: int
    status: str
    timeout: float


class RunState(NamedTuple):
    """A run as its writer process last told it."""

    run_id: int | None = None
    dropped: int = 0  # records the writer process dropped
    failing: str | None = None  # why the store takes no writes, in one line


def dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, PROTOCOL)


def loads(data: bytes) -> tuple[Any, ...]:
    message: tuple[Any, ...] = pickle.loads(data)  # from our own other end only
    return message
