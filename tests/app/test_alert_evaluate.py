"""The evaluator over a real store: fired once, resolved once, across restarts and ends."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scalewatch.app.alerts import evaluate
from scalewatch.app.alerts.config import default_rules, parse_rules
from scalewatch.app.alerts.evaluate import Evaluator
from scalewatch.app.alerts.kinds import ScaleForecastWatch, Watch
from scalewatch.app.alerts.text import alert_text
from scalewatch.store import watched as watched_store
from scalewatch.store.alerts import AlertRow, alert_page
from scalewatch.store.autopilot import disable_autopilot, save_decision, set_autopilot
from scalewatch.store.engine import Store, open_store
from scalewatch.store.records import StepRecord
from scalewatch.store.runs import create_run, end_run, write_step_values, write_steps
from scalewatch.store.states import AlertState
from scalewatch.store.step_rows import step_values
from tests._helpers.records import step_record

RULES = parse_rules(
    """
[[rule]]
name = "streak"
kind = "skip_streak"
threshold = 3

[[rule]]
name = "silent"
kind = "stalled"
threshold = 60
"""
).rules


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_store(request: pytest.FixtureRequest, db_url: str) -> Iterator[Store]:
    url = db_url if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    with open_store(url) as store:
        yield store


CONTROL = {"growth_interval": 20, "growth_factor": 2.0, "backoff_factor": 0.5}


class Clock:
    def __init__(self, now: float = 2050.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _records(first: int, last: int, skipped: set[int]) -> list[StepRecord]:
    return [
        step_record(
            step,
            wall_time=2000.0 + step,
            overflow=step in skipped,
            inf_ranks=(0,) if step in skipped else (),
            scale_after=512.0 if step in skipped else 1024.0,
            growth_interval=4,
        )
        for step in range(first, last + 1)
    ]


def _evaluator(store: Store, clock: Clock, changes: list[AlertRow], **batches: int) -> Evaluator:
    return Evaluator(store, RULES, on_change=changes.append, clock=clock, **batches)


def _alerts(store: Store) -> list[AlertRow]:
    return alert_page(store, limit=100)[0][::-1]


def test_an_alert_fires_once_and_resolves_once(any_store: Store) -> None:
    store, clock, changes = any_store, Clock(), []
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    evaluator = _evaluator(store, clock, changes)
    assert evaluator.tick() == []  # watched from its first step on
    write_steps(store, run.id, _records(1, 8, skipped={5, 6, 7, 8}))
    (fired,) = evaluator.tick()
    assert (fired.rule, fired.state, fired.fired_step, fired.value) == ("streak", "firing", 7, 3)
    assert fired.fired_at == 2007.0  # the step's wall time
    assert evaluator.tick() == []
    write_steps(store, run.id, _records(9, 10, skipped=set()))
    (resolved,) = evaluator.tick()
    assert (resolved.id, resolved.state) == (fired.id, AlertState.RESOLVED)
    assert (resolved.resolved_step, resolved.resolved_at, resolved.resolved_value) == (9, 2009.0, 0)
    assert alert_text(resolved).startswith(
        "scalewatch: streak (skip_streak) resolved on run 'bert' (#1) at step 9;"
        " it fired at step 7: 3 skipped steps in a row (threshold 3)"
    )
    write_steps(store, run.id, _records(11, 20, skipped={12, 13, 14, 16, 17, 18, 19, 20}))
    assert [(a.fired_step, a.resolved_step) for a in evaluator.tick()] == [
        (14, None), (14, 15), (18, None),
    ]  # fmt: skip
    assert [(a.fired_step, a.resolved_step, a.state) for a in _alerts(store)] == [
        (7, 9, "resolved"), (14, 15, "resolved"), (18, None, "firing"),
    ]  # fmt: skip
    assert len(changes) == 5


def test_a_restarted_service_keeps_what_fires_and_resolves_what_ended(any_store: Store) -> None:
    store, clock = any_store, Clock()
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    before = _evaluator(store, clock, [])
    before.tick()
    write_steps(store, run.id, _records(1, 8, skipped={5, 6, 7, 8}))
    (fired,) = before.tick()
    assert fired.fired_step == 7
    again: list[AlertRow] = []
    restarted = _evaluator(store, clock, again)
    assert restarted.tick() == []  # still firing: not again
    write_steps(store, run.id, _records(9, 9, skipped=set()))
    (resolved,) = restarted.tick()
    assert resolved.id == fired.id and resolved.resolved_step == 9
    assert len(_alerts(store)) == 1


def test_a_run_that_ends_resolves_its_alerts_at_its_last_step(any_store: Store) -> None:
    store, clock, changes = any_store, Clock(), []
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    evaluator = _evaluator(store, clock, changes)
    write_steps(store, run.id, _records(1, 6, skipped={4, 5, 6}))
    assert [a.state for a in evaluator.tick()] == ["firing"]
    end_run(store, run.id)
    clock.now += 1
    (resolved,) = evaluator.tick()
    assert (resolved.state, resolved.resolved_step, resolved.resolved_at) == ("resolved", 6, 2051)
    assert evaluator.tick() == []
    assert _evaluator(store, clock, changes).tick() == []  # nothing left for a new service


def test_stalled_fires_after_its_seconds_without_a_step_and_resolves_on_the_next(
    any_store: Store,
) -> None:
    store, clock, changes = any_store, Clock(), []
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    write_steps(store, run.id, _records(1, 3, skipped=set()))
    evaluator = _evaluator(store, clock, changes)
    assert evaluator.tick() == []  # its last step (at 2003) is 47 s old
    clock.now = 2070.0
    (fired,) = evaluator.tick()
    assert (fired.rule, fired.fired_step, fired.fired_at, fired.value) == ("silent", 3, 2063.0, 67)
    assert evaluator.tick() == []
    write_steps(store, run.id, _records(4, 4, skipped=set()))
    clock.now = 2080.0
    (resolved,) = evaluator.tick()
    assert (resolved.id, resolved.resolved_step, resolved.resolved_at) == (fired.id, 4, 2080.0)


def test_two_services_over_one_store_fire_it_once(any_store: Store) -> None:
    store, clock = any_store, Clock()
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    one: list[AlertRow] = []
    two: list[AlertRow] = []
    first, second = _evaluator(store, clock, one), _evaluator(store, clock, two)
    first.tick(), second.tick()
    write_steps(store, run.id, _records(1, 6, skipped={4, 5, 6}))
    assert len(first.tick()) == 1 and second.tick() == []
    write_steps(store, run.id, _records(7, 7, skipped=set()))
    assert len(second.tick()) == 1 and first.tick() == []
    ((fired, resolved),) = [(one[0], two[0])]
    assert fired.id == resolved.id and len(_alerts(store)) == 1


def test_a_write_that_fails_is_made_at_the_next_tick_with_its_steps(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    store, clock, changes = open_store(db_url), Clock(), []
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    evaluator = _evaluator(store, clock, changes)
    evaluator.tick()
    failures = {"fire_alert": 1, "resolve_alert": 1}

    def failing(name: str) -> object:
        real = getattr(evaluate, name)

        def once(*args: object, **kwargs: object) -> object:
            if failures[name]:
                failures[name] -= 1
                raise OSError("disk full")
            return real(*args, **kwargs)

        return once

    for name in failures:
        monkeypatch.setattr(evaluate, name, failing(name))
    write_steps(store, run.id, _records(1, 8, skipped={4, 5, 6, 7, 8}))
    with pytest.raises(OSError):
        evaluator.tick()
    assert _alerts(store) == [] and changes == []
    (fired,) = evaluator.tick()  # no step since: stored now, where the streak reached 3
    assert (fired.fired_step, fired.value) == (6, 3)
    write_steps(store, run.id, _records(9, 12, skipped=set()))
    with pytest.raises(OSError):
        evaluator.tick()
    (resolved,) = evaluator.tick()
    assert (resolved.id, resolved.resolved_step, resolved.resolved_at) == (fired.id, 9, 2009.0)
    write_steps(store, run.id, _records(13, 15, skipped={13, 14, 15}))
    (again,) = evaluator.tick()  # each step fed once: the streak is 3 at 15, not more
    assert (again.fired_step, again.value) == (15, 3)
    store.close()


def test_a_run_that_never_steps_stalls_at_step_0(any_store: Store) -> None:
    store, clock = any_store, Clock()
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    evaluator = _evaluator(store, clock, [])
    assert evaluator.tick() == []  # started now: 0 s silent on the service's clock
    clock.now += 61
    (fired,) = evaluator.tick()
    assert (fired.run_id, fired.rule, fired.fired_step) == (run.id, "silent", 0)
    assert fired.fired_at == 2050.0 + 60


def test_a_new_kind_is_a_params_model_and_a_watch_registered(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scalewatch.app.alerts.kinds import KINDS, Params, Reading, StepView, Watch, kind

    monkeypatch.setitem(KINDS, "scale_above", None)  # gone again after the test

    class Ceiling(Params):
        threshold: float = 2.0**20

    @kind("scale_above", Ceiling, "the scale after a step is over `threshold`", default=False)
    class ScaleAbove(Watch[Ceiling]):
        def step(self, row: StepView) -> Reading:
            return Reading(row.scale_after > self.params.threshold, row.scale_after)

    rules = parse_rules('[[rule]]\nname = "high"\nkind = "scale_above"\nthreshold = 1000\n').rules
    with open_store(db_url) as store:
        run = create_run(store, name="bert", world_size=1, config={}, control={})
        evaluator = Evaluator(store, rules, clock=Clock())
        evaluator.tick()
        write_steps(store, run.id, _records(1, 3, skipped={3}))  # 1024 until step 3's backoff
        fired, resolved = evaluator.tick()
    assert (fired.rule, fired.kind, fired.fired_step, resolved.resolved_step) == (
        "high", "scale_above", 1, 3,
    )  # fmt: skip
    assert "scale_above" not in {rule.kind for rule in default_rules()}


def test_an_autopilot_that_stops_itself_fires_until_it_is_turned_off(any_store: Store) -> None:
    store, clock, changes = any_store, Clock(), []
    run = create_run(store, name="bert", world_size=1, config={}, control=CONTROL)
    evaluator = Evaluator(store, default_rules(), on_change=changes.append, clock=clock)
    set_autopilot(store, run.id, {"enabled": True, "target_skip_rate": 0.01}, now=clock.now)
    write_steps(store, run.id, _records(1, 4, skipped=set()))
    assert [a.rule for a in evaluator.tick()] == []  # on and watching: nothing
    reason = "skipped-step rate 9.00% over 400 steps with growth_interval at its upper bound"
    assert save_decision(
        store, run.id, decision={"action": "stop"}, misses=0, helped_below=None, gave_up=reason
    )
    write_steps(store, run.id, _records(5, 6, skipped=set()))
    (fired,) = evaluator.tick()
    assert (fired.rule, fired.kind, fired.state, fired.detail) == (
        "autopilot", "autopilot", "firing", reason,
    )  # fmt: skip
    assert fired.fired_step == 6 and fired.value == 1
    assert evaluator.tick() == []  # once
    disable_autopilot(store, run.id, now=clock.now)
    write_steps(store, run.id, _records(7, 7, skipped=set()))
    (resolved,) = evaluator.tick()
    assert (resolved.id, resolved.state, resolved.resolved_step) == (fired.id, "resolved", 7)


def test_many_runs_are_read_a_batch_at_a_time_and_each_step_fed_once(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps of every run come from a few statements per tick (not one per run), in
    batches across the runs; a backlog larger than a batch and than a tick's share is fed
    over ticks, every step once and in order, each alert at its own step."""
    store, clock, changes = any_store, Clock(), []
    ids = [create_run(store, name=f"r{i}", world_size=1, config={}, control={}).id
           for i in range(10)]  # fmt: skip
    evaluator = _evaluator(store, clock, changes, batch_steps=7, tick_steps=12, runs_per_read=4)
    evaluator.tick()  # watched from step 0
    streak_at = {run: 3 + 2 * i for i, run in enumerate(ids)}  # skipped from here on 3 steps
    for run in ids:
        first = streak_at[run]
        write_steps(store, run, _records(1, 30, skipped={first, first + 1, first + 2}))
    fed: dict[int, list[int]] = {run: [] for run in ids}
    real_feed = Evaluator._feed_run

    def feed_run(self: Evaluator, watched: Any, batch: Any) -> None:
        fed[watched.run.id] += batch.steps
        real_feed(self, watched, batch)

    monkeypatch.setattr(Evaluator, "_feed_run", feed_run)
    reads: list[str] = []
    real_sql = watched_store.driver_sql

    def driver_sql(sql: str, dialect: str) -> str:
        reads.append(sql)
        return real_sql(sql, dialect)

    monkeypatch.setattr(watched_store, "driver_sql", driver_sql)  # new_steps' statements
    evaluator.tick()
    # 10 runs, 7 steps each a batch: two batches reach the tick's share of 12, each batch
    # three statements (runs by fours); one statement a run would be 20.
    assert len(reads) == 2 * 3
    # The tick's share each: a run stops being read once its share is met, after the batch
    # that met it.
    assert all(len(steps) == 14 for steps in fed.values()), fed
    while evaluator.tick() or any(len(steps) < 30 for steps in fed.values()):
        pass
    assert fed == {run: list(range(1, 31)) for run in ids}
    fired = {(alert.run_id, alert.fired_step) for alert in changes if alert.rule == "streak"}
    assert fired == {(run, streak_at[run] + 2) for run in ids}


def test_a_schedule_that_drifts_fires_with_its_lead_in_words(any_store: Store) -> None:
    store, clock, changes = any_store, Clock(), []
    rules = parse_rules('[[rule]]\nname = "drift"\nkind = "schedule_drift"\nthreshold = 2\n').rules
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    evaluator = Evaluator(store, rules, on_change=changes.append, clock=clock)
    assert evaluator.tick() == []  # watched from its first step on
    records, drift = [], 0
    for record in _records(1, 8, skipped={2, 4, 5}):
        records.append(dataclasses.replace(record, schedule_drift=drift))
        drift += record.skipped  # a scheduler stepped after each: the next record counts it
    write_steps(store, run.id, records)
    (fired,) = evaluator.tick()
    assert (fired.kind, fired.fired_step, fired.value) == ("schedule_drift", 5, 2)
    assert alert_text(fired) == (
        "scalewatch: drift (schedule_drift) firing on run 'bert' (#1) at step 5:"
        " schedule ahead of the weights by 2 steps (threshold 2)"
    )


def _stormy(first: int, last: int, seed: int) -> list[StepRecord]:
    """Calm stretches and stormy ones on 4 ranks: overflows, backoffs, growths, a drifting
    schedule."""
    rng = random.Random(seed)
    records, scale, drift, storm = [], 2.0**12, 0, 0.0
    for step in range(first, last + 1):
        if rng.random() < 0.004:
            storm = rng.choice([0.0, 0.0, 0.0, 0.05, 0.3])
        overflow = rng.random() < storm
        after = max(1.0, scale / 2) if overflow else scale * (2 if rng.random() < 0.01 else 1)
        drift = drift + 1 if overflow else max(0, drift - (rng.random() < 0.05))
        ranks = tuple(sorted(rng.sample(range(4), rng.choice([1, 1, 2])))) if overflow else ()
        records.append(step_record(step, wall_time=2000.0 + step, overflow=overflow,
                                   scale=scale, scale_after=min(after, 2.0**16),
                                   inf_ranks=ranks, schedule_drift=drift))  # fmt: skip
        scale = min(after, 2.0**16)
    return records


STORMY_RULES = parse_rules(
    "\n".join(
        f'[[rule]]\nname = "{kind}"\nkind = "{kind}"\n{params}\n'
        for kind, params in [
            ("scale_below", "threshold = 256"),
            ("scale_drop", "window = 20\nthreshold = 3"),
            ("skip_rate", "window = 30\nthreshold = 0.1"),
            ("skip_streak", "threshold = 3"),
            ("schedule_drift", "threshold = 2"),
            ("rank_hotspot", "window = 40\nthreshold = 0.6\nmin_overflows = 2"),
            ("scale_forecast", "window = 100\nthreshold = 5000"),
        ]
    )
).rules


def _stormy_alerts(url: str, handed: list[int] | None = None) -> list[tuple[Any, ...]]:
    """Every alert of a stormy run of 4000 steps, written and evaluated in batches of
    different sizes. With ``handed``, each write but the first and every fifth is handed to
    the evaluator as the ingest hands it over, and its steps added to ``handed``. (The
    first follows no step fed: a run without steps is watched from before any step, and
    a step 0 written is never handed over.)"""
    clock, rng = Clock(), random.Random(7)
    with open_store(url) as store:
        run = create_run(store, name="bert", world_size=4, config={}, control={})
        evaluator = Evaluator(store, STORMY_RULES, clock=clock)
        evaluator.tick()
        records = _stormy(1, 4000, seed=3)
        writes = 0
        while records:
            size = rng.choice([1, 5, 40, 200, 700])
            batch, records = records[:size], records[size:]
            if handed is None:
                write_steps(store, run.id, batch)
            else:
                values = [step_values(record) for record in batch]
                added = write_step_values(store, run.id, values, appended=True)
                assert added is not None
                writes += 1
                if writes > 1 and writes % 5:
                    evaluator.offer(run.id, added)
                    handed += [record.step for record in batch]
            clock.now = batch[-1].wall_time
            evaluator.tick()
        return [
            (a.rule, a.fired_step, a.fired_at, a.value, a.detail, a.resolved_step,
             a.resolved_at, a.resolved_value)
            for a in alert_page(store, limit=1000)[0][::-1]
        ]  # fmt: skip


def test_steps_fed_a_batch_at_a_time_fire_and_resolve_where_fed_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches a rule takes whole (no step of them can turn it on) and batches it reads
    step by step store the same alerts, at the same steps, as every step read alone."""
    batched = _stormy_alerts(f"sqlite:///{tmp_path / 'batched.db'}")
    monkeypatch.setattr(Watch, "quiet", lambda self, batch: None)
    monkeypatch.setattr(ScaleForecastWatch, "feed", Watch.feed)
    one_by_one = _stormy_alerts(f"sqlite:///{tmp_path / 'one_by_one.db'}")
    assert batched == one_by_one
    fired = {alert[0] for alert in batched}
    assert fired == {rule.name for rule in STORMY_RULES}  # every kind fired
    assert sum(alert[5] is not None for alert in batched) > len(fired)  # many resolved


def test_steps_the_ingest_hands_over_are_fed_as_if_read_and_not_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps of writes handed to the evaluator are fed without a read, and store the
    alerts reading them would; those of a write not handed over (a gap before the next)
    are read from the store, and only they."""
    read = _stormy_alerts(f"sqlite:///{tmp_path / 'read.db'}")
    read_back: list[int] = []
    real_new_steps = evaluate.new_steps

    def counted(*args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        rows = real_new_steps(*args, **kwargs)
        read_back.extend(row[1] for row in rows)
        return rows

    monkeypatch.setattr(evaluate, "new_steps", counted)
    handed: list[int] = []
    assert _stormy_alerts(f"sqlite:///{tmp_path / 'handed.db'}", handed) == read
    assert len(handed) > 2000
    assert sorted(read_back) == sorted(set(range(1, 4001)) - set(handed))


def test_handed_steps_that_do_not_follow_the_fed_ones_are_read_instead(
    any_store: Store,
) -> None:
    """A hand-over after a gap, one of steps fed already, and one with a scale the store
    would not give back as it is (not finite): the evaluator reads the store, each step
    fed once, in order."""
    store, clock, changes = any_store, Clock(), []
    run = create_run(store, name="bert", world_size=1, config={}, control={})
    evaluator = _evaluator(store, clock, changes)
    evaluator.tick()
    fed: list[int] = []
    real_feed = evaluator._feed_run

    def feed_run(watched: Any, batch: Any) -> None:
        fed.extend(batch.steps)
        real_feed(watched, batch)

    evaluator._feed_run = feed_run  # type: ignore[method-assign]

    def write(first: int, last: int, **changes: Any) -> Any:
        records = [dataclasses.replace(r, **changes) for r in _records(first, last, set())]
        return write_step_values(store, run.id, [step_values(r) for r in records], appended=True)

    first, second = write(1, 4), write(5, 8)
    evaluator.offer(run.id, second)  # after a gap: steps 1-4 were not handed over
    evaluator.tick()
    assert fed == list(range(1, 9))
    evaluator.offer(run.id, first)  # fed already
    evaluator.offer(run.id, write(9, 10, scale=math.inf))
    evaluator.tick()
    assert fed == list(range(1, 11))
