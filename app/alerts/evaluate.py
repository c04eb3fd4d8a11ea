"""The evaluator: every rule on every running run, fed the steps the store gained since
the last tick, and the clock.

A run is watched from the moment the service first sees it running: its watches are fed
the steps their windows need first (``Watch.history``), then the service's stored firing
alerts of the run are reconciled with what they say, so a restarted service neither
fires again what is firing nor forgets to resolve what ended meanwhile. From then on an
alert fires once at the step where its condition starts, and resolves once where it
ends; a run that finishes or crashes resolves what is firing on it at its last step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from math import isfinite
from operator import itemgetter
from typing import Any

from scalewatch.store.alerts import AlertRow, Firing, fire_alert, firing_alerts, resolve_alert
from scalewatch.store.engine import Store
from scalewatch.store.runs import Appended
from scalewatch.store.states import RunStatus
from scalewatch.store.step_rows import COLUMNS
from scalewatch.store.step_schema import STEP_FIELDS, Kind
from scalewatch.store.watched import (
    RUNS_PER_READ,
    WATCHED_COLUMNS,
    new_steps,
    recorded_last_step,
    watched_runs,
)

from .config import Rule
from .kinds import KINDS, Reading, RunView, Watch
from .steps import StepBatch

__all__ = ["BATCH_STEPS", "TICK_STEPS", "Evaluator"]

# The defaults of Evaluator's batch_steps and tick_steps.
BATCH_STEPS = 1000  # steps read of a run at once (of many runs in one statement)
TICK_STEPS = 50_000  # steps fed per run and tick at most: a long backlog spreads over ticks
# Writes handed over of one run kept for the next tick at most (two a second from a job
# that posts every 0.5 s); beyond it the tick reads them instead.
HANDED_WRITES = 64
# A stored row (its columns after run_id) as new_steps reads it, without the run.
_WATCHED = itemgetter(*(COLUMNS.index(name) for name in WATCHED_COLUMNS[1:]))
# Of those, the floats that must be finite for a row to read as the store gives it back
# (SQLite keeps a NaN as NULL): the step schema's non-null floats.
_KINDS = {f.name: f for f in STEP_FIELDS}
_FLOATS = tuple(
    i
    for i, name in enumerate(WATCHED_COLUMNS[1:])
    if _KINDS[name].kind is Kind.FLOAT and not _KINDS[name].nullable
)


@dataclass
class _Episode:
    """A rule's condition holding since ``step``."""

    step: int
    at: float
    value: float
    detail: str


@dataclass
class _Rule:
    """One rule on one run: what its watch says (``episode``) and what the store holds
    (``alert``); :meth:`Evaluator._sync` brings the store to the watch's word."""

    rule: Rule
    watch: Watch[Any]
    episode: _Episode | None = None  # the condition holds, since then
    value: float = 0.0  # the last reading's
    alert: AlertRow | None = None  # firing in the store
    ended: tuple[int, float] | None = None  # the step and time the stored alert's episode ended


@dataclass
class _Watched:
    run: RunView
    rules: list[_Rule]
    fed: int  # the last step its watches were fed: the cursor, moved step by step
    fed_at: float | None = None  # that step's wall time
    warm: bool = False  # history fed and reconciled: transitions are stored from now on
    done: list[AlertRow] = field(default_factory=list)
    # Where a rule's condition turned in the steps fed, to store in step order: (step, its
    # wall time, the rule, the reading); what a failed write left waits for the next tick.
    turns: deque[tuple[int, float, _Rule, Reading]] = field(default_factory=deque)
    stepping: list[_Rule] = field(init=False)  # the rules whose kind looks at steps

    def __post_init__(self) -> None:
        self.stepping = [rule for rule in self.rules if type(rule.watch).step is not Watch.step]


class Evaluator:
    """Evaluates ``rules`` over ``store``; each stored change is handed to ``on_change``.

    :meth:`tick` does one round (the service calls it every second or so, off the event
    loop); ticks from several threads take turns. Each round reads up to ``batch_steps``
    steps of each run a statement, ``runs_per_read`` runs a statement, and feeds at most
    ``tick_steps`` steps a run.
    """

    def __init__(
        self,
        store: Store,
        rules: Sequence[Rule],
        *,
        on_change: Callable[[AlertRow], None] = lambda alert: None,
        clock: Callable[[], float] = time.time,
        batch_steps: int = BATCH_STEPS,
        tick_steps: int = TICK_STEPS,
        runs_per_read: int = RUNS_PER_READ,
    ) -> None:
        self.store = store
        self.batch_steps, self.tick_steps = batch_steps, tick_steps
        self.runs_per_read = runs_per_read
        self.rules = tuple(rules)
        self.on_change = on_change
        self.clock = clock
        self._watched: dict[int, _Watched] = {}
        self._idle: set[int] = set()  # seen not running: looked at again once running
        self._changes: list[AlertRow] = []  # stored in this tick, delivered at its end
        self._lock = threading.Lock()
        # Steps the ingest stored, by run: (the run's last step before them, the rows).
        self._handed: dict[int, list[tuple[int, list[tuple[Any, ...]]]]] = {}
        self._handing = threading.Lock()  # never held across a tick: an offer never waits

    def offer(self, run_id: int, appended: Appended) -> None:
        """From the thread that has just stored ``appended`` (committed) after the run's
        last step: kept, if the run is watched, for the next tick, which feeds the steps
        without reading them back. Steps a tick cannot take so (after a gap, or
        more than ``HANDED_WRITES`` writes waiting) it reads from the store as before."""
        if run_id not in self._watched:
            return  # its first tick reads the history its watches need
        with self._handing:
            waiting = self._handed.setdefault(run_id, [])
            waiting.append((appended.after, appended.rows))
            if len(waiting) > HANDED_WRITES:
                del self._handed[run_id]

    def tick(self) -> list[AlertRow]:
        """One round over every run; returns the alerts that fired or resolved."""
        with self._lock:
            ready: list[tuple[RunView, _Watched]] = []
            try:
                for view in self._runs():
                    watched = self._ready(view)
                    if watched is not None:
                        ready.append((view, watched))
                self._feed([watched for _, watched in ready])
                for view, watched in ready:
                    self._tick_run(view, watched)
            finally:  # what was stored is delivered, also when a write failed after it
                for _, watched in ready:
                    done, watched.done = watched.done, []
                    self._changes += done
                changes, self._changes = self._changes, []
                for alert in changes:
                    self.on_change(alert)
            return changes

    def _runs(self) -> list[RunView]:
        rows = watched_runs(self.store)
        present = {row.id for row in rows}
        for gone in set(self._watched) - present:
            del self._watched[gone]
        return [
            RunView(
                id=row.id,
                name=row.name,
                world_size=row.world_size,
                running=RunStatus(row.status) is RunStatus.RUNNING,
                started_at=row.started_at,
                last_step=0,
                last_wall_time=None,
                autopilot_gave_up=row.autopilot_gave_up,
                min_scale=row.min_scale,
            )
            for row in rows
        ]

    def _ready(self, view: RunView) -> _Watched | None:
        """The run's watches, brought up to its stored status; None for a run not watched
        (not running, and never seen running by this evaluator)."""
        watched = self._watched.get(view.id)
        if watched is None:
            if not view.running:
                if view.id not in self._idle:
                    self._resolve_left(view)  # ended before this service saw it run
                    self._idle.add(view.id)
                return None
            self._idle.discard(view.id)
            watched = self._watch(view)
        watched.run = _with(
            watched.run,
            running=view.running,
            name=view.name,
            autopilot_gave_up=view.autopilot_gave_up,
        )
        return watched

    def _tick_run(self, view: RunView, watched: _Watched) -> None:
        """After the steps: reconcile a new watch, read the clock, store what changed."""
        if not watched.warm:
            self._reconcile(watched)
        now = self.clock()
        for entry in watched.rules:
            reading = entry.watch.clock(watched.run, now)
            if reading is not None:
                self._read(entry, reading, watched.run.last_step, now)
            if not view.running and entry.episode is not None:  # ended with the run
                self._read(entry, Reading(False, entry.value), watched.run.last_step, now)
            self._sync(watched, entry)  # also what a failed write left to do
        if not view.running:
            del self._watched[view.id]
            self._idle.add(view.id)

    def _watch(self, view: RunView) -> _Watched:
        entries = [
            _Rule(rule, KINDS[rule.kind].watch(rule.params, view))
            for rule in self.rules
            if rule.applies_to(view)
        ]
        history = max((entry.watch.history for entry in entries), default=1)
        start = max(-1, recorded_last_step(self.store, view.id) - history)
        # A run without steps is at step 0 for the clock side (the cursor reads from -1).
        watched = _Watched(_with(view, last_step=max(0, start)), entries, fed=start)
        self._watched[view.id] = watched
        return watched

    def _feed(self, watched: Sequence[_Watched]) -> None:
        """Feed every watched run the steps stored since its cursor: up to ``batch_steps``
        of each run a statement (many runs in one), at most ``tick_steps`` a run a tick."""
        pending = {entry.run.id: entry for entry in watched}
        fed = dict.fromkeys(pending, 0)
        for entry in watched:
            self._store_turns(entry)
        with self._handing:
            handed, self._handed = self._handed, {}
        for run_id, entry in pending.items():
            rows = _following(run_id, handed.get(run_id, ()), entry.fed, self.tick_steps)
            try:
                for first in range(0, len(rows), self.batch_steps):
                    self._feed_run(entry, StepBatch(rows[first : first + self.batch_steps]))
            finally:
                if rows:
                    _caught_up(entry)
            fed[run_id] = len(rows)
        # Then what the store holds beyond (steps handed over only once their run was
        # watched, written past the service, or after a gap): none, most ticks.
        pending = {run_id: e for run_id, e in pending.items() if fed[run_id] < self.tick_steps}
        while pending:
            cursors = {run_id: entry.fed for run_id, entry in pending.items()}
            rows = new_steps(
                self.store, cursors, per_run=self.batch_steps, runs_per_read=self.runs_per_read
            )
            read = dict.fromkeys(pending, 0)
            try:
                for run_id, steps in groupby(rows, key=itemgetter(0)):
                    batch = StepBatch(list(steps))
                    read[run_id] = len(batch.rows)
                    self._feed_run(pending[run_id], batch)
            finally:  # also when a store write failed: the clock side sees what was fed
                for run_id, count in read.items():
                    if count:
                        _caught_up(pending[run_id])
            for run_id, count in read.items():
                fed[run_id] += count
                if count < self.batch_steps or fed[run_id] >= self.tick_steps:  # read to its end
                    del pending[run_id]

    def _feed_run(self, watched: _Watched, batch: StepBatch) -> None:
        """Feed every watch ``batch``, then store where each condition turned, step by
        step: a failed write leaves no watch fed twice, and the turns after it to the next
        tick."""
        turns: list[tuple[int, _Rule, Reading]] = []
        for entry in watched.stepping:  # most batches turn nothing
            fed = entry.watch.feed(batch, entry.episode is not None)
            if fed.last is not None:
                entry.value = fed.last.value
            turns += [(i, entry, reading) for i, reading in fed.turns]
        turns.sort(key=itemgetter(0))  # by step; at one step, in the rules' order
        steps, times = batch.steps, batch.wall_times
        watched.turns += [(steps[i], times[i], entry, reading) for i, entry, reading in turns]
        watched.fed, watched.fed_at = steps[-1], times[-1]
        self._store_turns(watched)

    def _store_turns(self, watched: _Watched) -> None:
        """Follow and store each turn in order. A turn is taken off before its write, whose
        failure :meth:`_sync` makes good later; the rule's value stays its last step's."""
        while watched.turns:
            step, at, entry, reading = watched.turns.popleft()
            latest = entry.value
            self._read(entry, reading, step, at)
            try:
                self._sync(watched, entry)
            finally:
                entry.value = latest

    def _read(self, entry: _Rule, reading: Reading, step: int, at: float) -> None:
        """Follow the watch's word in memory: an episode starts, or ends."""
        entry.value = reading.value
        at = reading.at if reading.at is not None else at
        if reading.on and entry.episode is None:
            entry.episode = _Episode(step, at, reading.value, reading.detail)
        elif not reading.on and entry.episode is not None:
            entry.episode = None
            if entry.alert is not None:
                entry.ended = (step, at)

    def _sync(self, watched: _Watched, entry: _Rule) -> None:
        """Store what the watch says and the store does not yet: resolve an alert whose
        episode ended, fire one whose episode is on. A write that fails is made again at
        the next tick, with the steps and times it had."""
        if not watched.warm:
            return
        if entry.alert is not None and entry.ended is not None:
            step, at = entry.ended
            resolved = resolve_alert(
                self.store, entry.alert.id, step=step, at=at, value=entry.value
            )
            if resolved is not None:  # else another service resolved it
                watched.done.append(resolved)
            entry.alert, entry.ended = None, None
        if entry.episode is not None and entry.alert is None:
            self._fire(watched, entry)

    def _fire(self, watched: _Watched, entry: _Rule) -> None:
        episode = entry.episode
        assert episode is not None
        rule, run = entry.rule, watched.run
        firing = Firing(
            run_id=run.id,
            rule=rule.name,
            kind=rule.kind,
            threshold=float(rule.params.threshold),
            value=episode.value,
            detail=episode.detail,
            step=episode.step,
            at=episode.at,
        )
        alert = fire_alert(self.store, firing)
        if alert is None:  # fired by another service over this store: follow its row
            stored = firing_alerts(self.store, run.id)
            alert = next((a for a in stored if a.rule == rule.name), None)
        else:
            watched.done.append(alert)
        entry.alert = alert

    def _reconcile(self, watched: _Watched) -> None:
        """After the history: fire what holds and is not stored as firing; resolve what is
        stored as firing and no longer holds (or whose rule is gone)."""
        stored = {alert.rule: alert for alert in firing_alerts(self.store, watched.run.id)}
        step, now = watched.run.last_step, self.clock()
        for entry in watched.rules:
            entry.alert = stored.pop(entry.rule.name, None)
            if entry.alert is not None and entry.episode is None:
                entry.ended = (step, now)
        watched.warm = True  # the tick's _sync stores what differs
        for alert in stored.values():
            resolved = resolve_alert(self.store, alert.id, step=step, at=now, value=alert.value)
            if resolved is not None:
                watched.done.append(resolved)

    def _resolve_left(self, view: RunView) -> None:
        """Resolve what another service process left firing on a run that has ended."""
        left = firing_alerts(self.store, view.id)
        if not left:
            return
        last = recorded_last_step(self.store, view.id)
        for alert in left:
            step = max(alert.fired_step, last)
            resolved = resolve_alert(
                self.store, alert.id, step=step, at=self.clock(), value=alert.value
            )
            if resolved is not None:
                self._changes.append(resolved)


def _caught_up(watched: _Watched) -> None:
    """The run as the clock side sees it: at the last step its watches were fed."""
    if watched.fed != watched.run.last_step:
        watched.run = _with(watched.run, last_step=watched.fed, last_wall_time=watched.fed_at)


def _following(
    run_id: int, handed: Sequence[tuple[int, list[tuple[Any, ...]]]], fed: int, limit: int
) -> list[tuple[Any, ...]]:
    """The steps handed over that follow step ``fed`` with none missing, as
    :func:`~scalewatch.store.watched.new_steps` reads them; up to the first that does not
    (a gap, a float the store would not give back as it is) or ``limit`` steps."""
    rows: list[tuple[Any, ...]] = []
    for after, chunk in handed:
        if chunk[-1][0] <= fed:
            continue  # read by a tick already
        if after > fed:
            break
        for row in chunk if after == fed else [r for r in chunk if r[0] > fed]:
            watched = _WATCHED(row)
            if not all(isfinite(watched[i]) for i in _FLOATS):
                return rows
            rows.append((run_id, *watched))
        fed = chunk[-1][0]
        if len(rows) >= limit:
            break
    return rows


def _with(view: RunView, **changes: Any) -> RunView:
    values = {name: getattr(view, name) for name in RunView.__slots__}
    values.update(changes)
    return RunView(**values)
