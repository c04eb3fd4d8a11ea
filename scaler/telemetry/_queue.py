"""The writer's queue: one ordered queue of commands, carried out by the writer in order.

Runs between the reporting rank's threads: the recorder thread puts steps (each followed by
the control outcomes made at it), the training thread puts scale loads, the control poller
outcomes it settled; the writer thread takes the commands and carries them out in the
order they were queued. Neither side waits on the store. Past ``max_pending`` steps the
oldest are dropped and counted, and a gap takes their place in the queue, so that it is
recorded where they would have been once the store takes writes again.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from .._control import ControlOutcome
from .._step_sample import StepSample
from ..store.records import ScaleLoad
from ..store.runs import finding_rows, norm_rows, step_values


class Diagnosed(tuple[Any, ...]):
    """The :func:`step_values` of a step that carries its findings as ``overflow_params``
    rows (an explained overflow), or its largest parameter norms (a run that measures the
    gradient norm): queued, put back and dropped with its step as one item.

    Steps with neither stay plain tuples.
    """

    findings: list[tuple[Any, ...]]
    norms: list[tuple[Any, ...]]

    def __new__(
        cls,
        values: tuple[Any, ...],
        findings: list[tuple[Any, ...]],
        norms: list[tuple[Any, ...]] | None = None,
    ) -> Diagnosed:
        self = super().__new__(cls, values)
        self.findings = findings
        self.norms = norms or []
        return self


def findings_of(batch: list[Any]) -> list[tuple[Any, ...]]:
    """The ``overflow_params`` rows of the steps in ``batch``."""
    return [row for values in batch if type(values) is Diagnosed for row in values.findings]


def norms_of(batch: list[Any]) -> list[tuple[Any, ...]]:
    """The largest parameter norms of the steps in ``batch``."""
    return [row for values in batch if type(values) is Diagnosed for row in values.norms]


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """A control outcome to write; ``step`` is None for one settled at no step."""

    step: int | None
    at: float
    outcome: ControlOutcome


@dataclass(frozen=True, slots=True)
class RecordLoad:
    """A load of the scaler's state into the run (``scale_loads``)."""

    load: ScaleLoad


@dataclass(frozen=True, slots=True)
class RecordGap:
    """Steps ``first`` to ``last`` dropped (``dropped`` records) before they were written."""

    first: int
    last: int
    dropped: int


# A step is its step_values() tuple (or a Diagnosed one): plain tuples, which the garbage
# collector stops tracking, and no object made per step beyond them.
Command = tuple[Any, ...] | WriteOutcome | RecordLoad | RecordGap


def is_step(command: Command) -> bool:
    kind = type(command)
    return kind is tuple or kind is Diagnosed


class CommandQueue:
    """The commands waiting for the writer, oldest first; and how the writer and those
    who wait for it meet, in these methods alone.

    ``lock`` guards everything here; ``_idle`` (on ``lock``) is notified after each pass
    of the writer (:meth:`pass_done`); ``_wake`` says something was queued, ``_hurry`` to
    write it without gathering more (a whole batch is queued, or a flush waits).
    """

    def __init__(self, max_pending: int, batch: int) -> None:
        self._max_pending = max_pending
        self._batch = batch
        self.commands: deque[Command] = deque()
        self._steps = 0  # steps among the commands
        self.in_flight = 0  # steps the writer took and is writing
        self._writing = False  # the writer carries out commands it took
        self.dropped = 0
        self.lock = threading.Lock()
        self._idle = threading.Condition(self.lock)
        self._wake = threading.Event()
        self._hurry = threading.Event()

    def put(self, samples: list[StepSample]) -> None:
        """Each sample's step, then the control outcomes made at it. Called by the recorder
        thread; never blocks on the store."""
        commands = self.commands
        with self.lock:
            for sample in samples:
                record = sample.record
                if record.params or record.param_norms:
                    findings, norms = finding_rows([record]), norm_rows([record])
                    commands.append(Diagnosed(step_values(record), findings, norms))
                else:
                    commands.append(step_values(record))
                for outcome in sample.controls:
                    commands.append(WriteOutcome(record.step, record.wall_time, outcome))
            full = self._added(len(samples))
        self._woken(full)

    def put_values(self, values: list[tuple[Any, ...]]) -> None:
        """Steps already made their ``steps`` rows (:func:`step_values`), with nothing rare
        about them: no findings, no parameter norms, no control outcome. Never blocks."""
        with self.lock:
            self.commands.extend(values)
            full = self._added(len(values))
        self._woken(full)

    def _added(self, count: int) -> bool:
        """``count`` steps were queued (``lock`` held): drop the oldest past the bound;
        whether a whole batch waits."""
        self._steps += count
        # The batch being written counts: it may fail and come back.
        overflow = self._steps + self.in_flight - self._max_pending
        if overflow > 0:
            self._drop_oldest(min(overflow, self._steps))
        return self._steps >= self._batch

    def _woken(self, full: bool) -> None:
        if full:
            self._hurry.set()
        self._wake.set()

    def put_outcome(self, outcome: WriteOutcome) -> None:
        with self.lock:
            self.commands.append(outcome)
        self._wake.set()

    def put_load(self, load: ScaleLoad) -> None:
        """A scale load the training thread noted: written before the steps queued after it."""
        with self.lock:
            self.commands.append(RecordLoad(load))
        self._wake.set()

    def put_gap(self, gap: RecordGap) -> None:
        """Steps dropped before they reached this queue (by the training process, in
        front of the writer's own): counted here, recorded where they would have been."""
        with self.lock:
            self.commands.append(gap)
            self.dropped += gap.dropped
        self._wake.set()

    def _drop_oldest(self, count: int) -> None:
        """Drop the ``count`` oldest steps, a gap in their place; call with ``lock`` held.

        Only the first steps are looked at: what comes before them (a load, an outcome, a
        gap) is set aside and put back in front, in its order.
        """
        commands = self.commands
        ahead: list[Command] = []
        while count:
            command = commands.popleft()
            if not is_step(command):
                ahead.append(command)
                continue
            assert isinstance(command, tuple)
            step = command[0]
            last = ahead[-1] if ahead else None
            if isinstance(last, RecordGap) and last.last + 1 == step:
                ahead[-1] = RecordGap(last.first, step, last.dropped + 1)
            else:
                ahead.append(RecordGap(step, step, 1))
            self._steps -= 1
            self.dropped += 1
            count -= 1
        commands.extendleft(reversed(ahead))

    # ------------------------------------------------ the writer's side

    def wait_for_work(self, idle_s: float, coalesce_s: float) -> None:
        """The writer's wait before a pass: up to ``idle_s`` for something queued, then up
        to ``coalesce_s`` for more to gather, unless a whole batch or a flush hurries it."""
        if self._wake.wait(idle_s):
            self._hurry.wait(coalesce_s)
        self._wake.clear()
        self._hurry.clear()

    def take(self) -> list[Command]:
        """The next commands to carry out, which leave the queue: up to a batch of steps
        in a row, the gaps in a row (joined where they touch), or one other command.

        Steps dropped while these are written are never these; :meth:`put_back` returns
        them to the front if carrying them out fails.
        """
        commands = self.commands
        with self.lock:
            if not commands:
                return []
            self._writing = True
            head = commands[0]
            if is_step(head):
                taken: list[Command] = []
                while commands and len(taken) < self._batch and is_step(commands[0]):
                    taken.append(commands.popleft())
                self._steps -= len(taken)
                self.in_flight = len(taken)
                return taken
            if isinstance(head, RecordGap):
                gaps: list[RecordGap] = []
                while commands and isinstance(commands[0], RecordGap):
                    gap = commands.popleft()
                    assert isinstance(gap, RecordGap)
                    gaps.append(gap)
                return list(joined(gaps))
            return [commands.popleft()]

    def put_back(self, taken: list[Command]) -> None:
        """Commands whose carrying out failed, to the front, in their order."""
        with self.lock:
            self.commands.extendleft(reversed(taken))
            self._steps += sum(1 for command in taken if is_step(command))

    def written(self) -> None:
        with self.lock:
            self.in_flight = 0
            self._writing = False

    def pass_done(self) -> None:
        """The writer has made a pass: those waiting in :meth:`hurry` look again."""
        with self.lock:
            self._idle.notify_all()

    def first_wall_time(self) -> float | None:
        """The wall time of the oldest step queued, if any."""
        with self.lock:
            for command in self.commands:
                if is_step(command):
                    assert isinstance(command, tuple)
                    wall_time: float = command[1]
                    return wall_time
            return None

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

    def count_dropped(self, count: int) -> None:
        """``count`` steps taken were refused for good, not written."""
        with self.lock:
            self.dropped += count

    def drop_unwritten(self) -> int:
        """Count the steps queued or being written as dropped (at close); returns how many."""
        with self.lock:
            unwritten = self._unwritten()
            self.dropped += unwritten
        return unwritten

    def unwritten(self) -> int:
        """Steps queued or being written."""
        with self.lock:
            return self._unwritten()

    def _busy(self) -> bool:
        """Something is queued or being written; call with ``lock`` held."""
        return bool(self.commands or self._writing)

    def _unwritten(self) -> int:
        """Steps queued or being written; call with ``lock`` held."""
        return self._steps + self.in_flight


def joined(gaps: list[RecordGap]) -> list[RecordGap]:
    """``gaps`` in step order, ranges that touch joined into one.

    A batch whose write failed goes back to the front of the queue; when it is dropped
    after steps that came in while it was being written, its steps open a second range
    right before the first.

    >>> joined([RecordGap(4, 6, 3), RecordGap(1, 3, 3), RecordGap(9, 9, 1)])
    [RecordGap(first=1, last=6, dropped=6), RecordGap(first=9, last=9, dropped=1)]
    """
    result: list[RecordGap] = []
    for gap in sorted(gaps, key=lambda gap: gap.first):
        if result and result[-1].last + 1 == gap.first:
            before = result[-1]
            result[-1] = RecordGap(before.first, gap.last, before.dropped + gap.dropped)
        else:
            result.append(gap)
    return result
