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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from app.alerts.kinds import KINDS, Reading, RunView, StepView, Watch
from app.alerts.rules import Rule
from scaler.store.alerts import AlertRow, Firing, fire_alert, firing_alerts, resolve_alert
from scaler.store.engine import Store
from scaler.store.queries import parse_ranks, step_rows_after
from scaler.store.schema import runs
from scaler.store.states import RunStatus

__all__ = ["BATCH_STEPS", "TICK_STEPS", "Evaluator"]

BATCH_STEPS = 5000  # steps read at once
TICK_STEPS = 50_000  # steps fed per run and tick at most: a long backlog spreads over ticks


@dataclass
class _Episode:
    """A rule's condition holding since ``step``."""

    step: int
    at: float
    value: float
    detail: str


@dataclass
class _Rule:
    rule: Rule
    watch: Watch[Any]
    episode: _Episode | None = None
    value: float = 0.0  # the last reading's
    alert: AlertRow | None = None  # firing in the store


@dataclass
class _Watched:
    run: RunView
    rules: list[_Rule]
    warm: bool = False  # history fed and reconciled: transitions are stored from now on
    done: list[AlertRow] = field(default_factory=list)


class Evaluator:
    """Evaluates ``rules`` over ``store``; each stored change is handed to ``on_change``.

    :meth:`tick` does one round (the service calls it every second or so, off the event
    loop); ticks from several threads take turns.
    """

    def __init__(
        self,
        store: Store,
        rules: Sequence[Rule],
        *,
        on_change: Callable[[AlertRow], None] = lambda alert: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.rules = tuple(rules)
        self.on_change = on_change
        self.clock = clock
        self._watched: dict[int, _Watched] = {}
        self._idle: set[int] = set()  # seen not running: looked at again once running
        self._lock = threading.Lock()

    def tick(self) -> list[AlertRow]:
        """One round over every run; returns the alerts that fired or resolved."""
        with self._lock:
            changes: list[AlertRow] = []
            for view in self._runs():
                changes += self._tick_run(view)
            for alert in changes:
                self.on_change(alert)
            return changes

    def _runs(self) -> list[RunView]:
        query = select(
            runs.c.id, runs.c.name, runs.c.status, runs.c.world_size, runs.c.started_at
        ).order_by(runs.c.id)
        with self.store.read() as conn:
            rows = conn.execute(query).all()
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
            )
            for row in rows
        ]

    def _tick_run(self, view: RunView) -> list[AlertRow]:
        watched = self._watched.get(view.id)
        if watched is None:
            if not view.running:
                if view.id in self._idle:
                    return []
                self._idle.add(view.id)  # ended before this service saw it run
                return self._resolve_left(view)
            self._idle.discard(view.id)
            watched = self._watch(view)
        watched.run = _with(watched.run, running=view.running, name=view.name)
        self._feed(watched)
        if not watched.warm:
            self._reconcile(watched)
        now = self.clock()
        for entry in watched.rules:
            reading = entry.watch.clock(watched.run, now)
            if reading is not None:
                self._read(watched, entry, reading, watched.run.last_step, now)
        if not view.running:
            for entry in watched.rules:
                self._end(watched, entry, watched.run.last_step, now)
            del self._watched[view.id]
            self._idle.add(view.id)
        done, watched.done = watched.done, []
        return done

    def _watch(self, view: RunView) -> _Watched:
        entries = [
            _Rule(rule, KINDS[rule.kind].watch(rule.params, view))
            for rule in self.rules
            if rule.applies_to(view)
        ]
        history = max((entry.watch.history for entry in entries), default=1)
        with self.store.read() as conn:
            last = conn.execute(select(runs.c.last_step).where(runs.c.id == view.id)).scalar()
        start = max(-1, int(last or 0) - history)
        watched = _Watched(_with(view, last_step=start), entries)
        self._watched[view.id] = watched
        return watched

    def _feed(self, watched: _Watched) -> None:
        fed = 0
        while fed < TICK_STEPS:
            rows = step_rows_after(
                self.store, watched.run.id, watched.run.last_step, limit=BATCH_STEPS
            )
            for row in rows:
                self._step(watched, _step_view(row))
            if rows:
                last = rows[-1]
                watched.run = _with(watched.run, last_step=last[0], last_wall_time=last[1])
            fed += len(rows)
            if len(rows) < BATCH_STEPS:
                return

    def _step(self, watched: _Watched, step: StepView) -> None:
        for entry in watched.rules:
            reading = entry.watch.step(step)
            if reading is None:
                continue
            entry.value = reading.value
            if bool(reading.on) != (entry.episode is not None):  # most steps change nothing
                self._read(watched, entry, reading, step.step, step.wall_time)

    def _read(
        self, watched: _Watched, entry: _Rule, reading: Reading, step: int, at: float
    ) -> None:
        entry.value = reading.value
        if reading.on and entry.episode is None:
            at = reading.at if reading.at is not None else at
            entry.episode = _Episode(step, at, reading.value, reading.detail)
            if watched.warm:
                self._fire(watched, entry)
        elif not reading.on and entry.episode is not None:
            entry.episode = None
            if watched.warm:
                self._end(watched, entry, step, reading.at if reading.at is not None else at)

    def _fire(self, watched: _Watched, entry: _Rule) -> None:
        episode = entry.episode
        assert episode is not None
        rule, run = entry.rule, watched.run
        threshold = float(entry.rule.params.threshold)
        firing = Firing(
            run.id,
            rule.name,
            rule.kind,
            threshold,
            episode.value,
            episode.detail,
            episode.step,
            episode.at,
        )
        alert = fire_alert(self.store, firing)
        if alert is None:  # fired by another service over this store: follow its row
            alert = next(
                (a for a in firing_alerts(self.store, run.id) if a.rule == rule.name), None
            )
        else:
            watched.done.append(alert)
        entry.alert = alert

    def _end(self, watched: _Watched, entry: _Rule, step: int, at: float) -> None:
        entry.episode = None
        if entry.alert is not None:
            resolved = resolve_alert(
                self.store, entry.alert.id, step=step, at=at, value=entry.value
            )
            if resolved is not None:
                watched.done.append(resolved)
            entry.alert = None

    def _reconcile(self, watched: _Watched) -> None:
        """After the history: fire what holds and is not stored as firing; resolve what is
        stored as firing and no longer holds (or whose rule is gone)."""
        stored = {alert.rule: alert for alert in firing_alerts(self.store, watched.run.id)}
        watched.warm = True
        step, now = watched.run.last_step, self.clock()
        for entry in watched.rules:
            entry.alert = stored.pop(entry.rule.name, None)
            if entry.episode is not None and entry.alert is None:
                self._fire(watched, entry)
            elif entry.episode is None and entry.alert is not None:
                self._end(watched, entry, step, now)
        for alert in stored.values():
            resolved = resolve_alert(self.store, alert.id, step=step, at=now, value=alert.value)
            if resolved is not None:
                watched.done.append(resolved)

    def _resolve_left(self, view: RunView) -> list[AlertRow]:
        """Resolve what another service process left firing on a run that has ended."""
        changes: list[AlertRow] = []
        left = firing_alerts(self.store, view.id)
        if not left:
            return changes
        with self.store.read() as conn:
            last = conn.execute(select(runs.c.last_step).where(runs.c.id == view.id)).scalar()
        for alert in left:
            step = max(alert.fired_step, int(last or 0))
            resolved = resolve_alert(
                self.store, alert.id, step=step, at=self.clock(), value=alert.value
            )
            if resolved is not None:
                changes.append(resolved)
        return changes


def _with(view: RunView, **changes: Any) -> RunView:
    values = {name: getattr(view, name) for name in RunView.__slots__}
    values.update(changes)
    return RunView(**values)


def _step_view(row: Sequence[Any]) -> StepView:
    """A row of ``step_rows_after`` (``EXPORT_COLUMNS`` order) as the rules read it."""
    step, wall_time, scale, overflow, skipped, inf_ranks, scale_after = row[:7]
    return StepView(
        step=step,
        wall_time=wall_time,
        scale=scale,
        scale_after=scale_after,
        overflow=bool(overflow),
        skipped=bool(skipped),
        inf_ranks=tuple(parse_ranks(inf_ranks)),
    )
