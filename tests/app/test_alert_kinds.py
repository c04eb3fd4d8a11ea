"""Each rule kind on crafted step histories: where its condition starts and ends."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from pydantic import ValidationError

from scalewatch.app.alerts.kinds import KINDS, Reading, RunView, StepView
from scalewatch.app.alerts.text import said
from scalewatch.app.alerts.units import Unit

RUN = RunView(1, "bert", 4, True, 1000.0, 0, None)


def _steps(
    skipped: Iterable[int] = (),
    backoffs: Iterable[int] = (),
    ranks: dict[int, tuple[int, ...]] | None = None,
    *,
    last: int = 100,
    scale: dict[int, float] | None = None,
) -> list[StepView]:
    skipped, backoffs, ranks = set(skipped), set(backoffs), ranks or {}
    rows = []
    for step in range(1, last + 1):
        before = (scale or {}).get(step, 1024.0)
        after = before / 2 if step in backoffs else before
        overflow = step in skipped or step in ranks
        rows.append(
            StepView(step, 1000.0 + step, before, after, overflow, step in skipped,
                     ranks.get(step, ()))
        )  # fmt: skip
    return rows


def _turns(kind: str, rows: list[StepView], run: RunView = RUN, **params: object) -> list[tuple]:
    """``(step, on, value)`` at each step where the condition changes."""
    spec = KINDS[kind]
    watch = spec.watch(spec.params.model_validate(params), run)
    turns, on = [], False
    for row in rows:
        reading = watch.step(row)
        assert isinstance(reading, Reading)
        if reading.on != on:
            on = reading.on
            turns.append((row.step, on, reading.value))
    return turns


def test_the_registry_holds_every_kind_with_a_default_rule() -> None:
    assert set(KINDS) == {
        "scale_below", "scale_drop", "skip_rate", "skip_streak", "stalled", "rank_hotspot",
        "autopilot", "schedule_drift", "scale_forecast", "loss_spike", "grad_norm_spike",
    }  # fmt: skip
    assert all(spec.default for spec in KINDS.values())


def test_scale_below_holds_while_the_scale_after_a_step_is_under_the_floor() -> None:
    scale = {step: 0.5 for step in range(40, 60)}
    rows = _steps(scale=scale)
    assert _turns("scale_below", rows, threshold=1.0) == [(40, True, 0.5), (60, False, 1024.0)]
    assert _turns("scale_below", rows, threshold=0.25) == []


def test_scale_drop_counts_backoffs_within_the_window() -> None:
    rows = _steps(backoffs=[10, 20, 30, 31])
    # The 4th backoff (31) has 4 within 30 steps; it ends when step 10 leaves the window.
    assert _turns("scale_drop", rows, window=30, threshold=4) == [(31, True, 4.0), (40, False, 3.0)]
    assert _turns("scale_drop", rows, window=20, threshold=4) == []


def test_skip_rate_over_a_full_window_above_the_threshold() -> None:
    rows = _steps(skipped=[2, 3, 4, 5, 30, 31, 32])
    # Steps 2-5 are 40% of the first 10, but the window is not full before step 10.
    turns = _turns("skip_rate", rows, window=10, threshold=0.2)
    assert turns == [(10, True, 0.4), (13, False, 0.2), (32, True, 0.3), (40, False, 0.2)]


def test_schedule_drift_fires_once_the_schedule_is_threshold_steps_ahead() -> None:
    rows = _steps(skipped=[5, 6, 30, 31, 32])
    drift = 0
    for row in rows:  # a scheduler stepped after every step: counted in the next record
        row.schedule_drift = drift
        drift += row.skipped
    assert _turns("schedule_drift", rows, threshold=4) == [(32, True, 4.0)]  # 5, 6, 30, 31
    held = [StepView(r.step, r.wall_time, r.scale, r.scale_after, r.overflow, r.skipped, (), 0)
            for r in rows]  # fmt: skip
    unregistered = _steps(skipped=range(1, 100))  # no scheduler: None, never a reading
    assert _turns("schedule_drift", held, threshold=1) == []
    assert _turns("schedule_drift", unregistered, threshold=1) == []


@pytest.mark.parametrize("what", ["loss", "grad_norm"])
def test_a_spike_alert_fires_at_threshold_spikes_within_its_window(what: str) -> None:
    rows = _steps()
    for row in rows:
        setattr(row, f"{what}_spike", row.step in (10, 40, 45))
    assert _turns(f"{what}_spike", rows, window=20, threshold=2) == [
        (45, True, 2.0),
        (60, False, 1.0),
    ]
    assert _turns(f"{what}_spike", rows) == [(10, True, 1.0)]  # the default: any spike in 1000


def test_skip_streak_fires_at_the_nth_skipped_step_in_a_row() -> None:
    rows = _steps(skipped=[5, 6, 7, 20, 21, 22, 23, 24])
    assert _turns("skip_streak", rows, threshold=4) == [(23, True, 4.0), (25, False, 0.0)]


def test_rank_hotspot_names_the_rank_in_most_overflow_reports() -> None:
    ranks = {10: (3,), 20: (3,), 30: (1, 3), 40: (3,), 50: (3,), 60: (0,)}
    spec = KINDS["rank_hotspot"]
    watch = spec.watch(spec.params.model_validate({"window": 100, "threshold": 0.6}), RUN)
    readings = {row.step: watch.step(row) for row in _steps(ranks=ranks, last=120)}
    assert not readings[49].on  # 4 overflows: under min_overflows (5)
    assert readings[50] == Reading(True, 5 / 6, detail="last 5 overflows on rank 3")
    assert readings[60].on and readings[60].value == 5 / 7
    # step 10 left the window
    assert readings[110] == Reading(True, 4 / 6, detail="last 5 overflows on rank 3")
    assert not readings[120].on  # step 20 too: 4 overflows in the window
    assert not spec.applies(RunView(2, "one rank", 1, True, 0.0, 0, None))
    assert spec.applies(RUN)


def test_rank_hotspot_hovering_about_its_threshold_fires_once() -> None:
    """The demo's rank_hotspot fired and resolved 6 times in 4 minutes, its share at 61-62%
    of a 60% threshold, now and then at 60% or under: once firing, it holds until the
    share falls to ``resolve_below`` (default: the threshold less 0.05)."""
    spec = KINDS["rank_hotspot"]
    params = spec.params.model_validate({"window": 100, "threshold": 0.6}).model_dump()
    # An overflow every 5 steps, 20 in the window: rank 1 in 13 of 20 (65%), then 12 (60%),
    # over and over; then the three ranks in turn (33% each); then 65% again.
    above = [1, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0]
    at = [1, 1, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0]
    even = [0, 1, 2] * 7
    history = (above + at) * 3 + even + above
    ranks = {5 * (i + 1): (rank,) for i, rank in enumerate(history)}
    rows = _steps(ranks=ranks, last=5 * len(history) + 4)

    turns = _turns("rank_hotspot", rows, **params)

    assert [on for _, on, _ in turns] == [True, False, True]  # resolved in the even stretch
    assert turns[1][2] <= 0.55
    # Without the band (resolve_below = threshold) the same history flaps.
    flapping = _turns("rank_hotspot", rows, **{**params, "resolve_below": 0.6})
    assert [on for _, on, _ in flapping[:6]] == [True, False] * 3


def test_rank_hotspot_refuses_a_resolve_level_above_its_threshold() -> None:
    with pytest.raises(ValidationError, match="resolve_below"):
        KINDS["rank_hotspot"].params.model_validate({"threshold": 0.6, "resolve_below": 0.7})


def test_stalled_counts_seconds_without_a_new_step_on_the_services_clock() -> None:
    spec = KINDS["stalled"]
    watch = spec.watch(spec.params.model_validate({"threshold": 60}), RUN)
    at_start = RunView(1, "bert", 4, True, 1000.0, 7, 1010.0)
    # First look: the store's last step, 1010, is 30 s old.
    assert watch.clock(at_start, now=1040.0) == Reading(False, 30.0, at=1040.0)
    assert watch.clock(at_start, now=1080.0) == Reading(True, 70.0, at=1070.0)
    later = RunView(1, "bert", 4, True, 1000.0, 8, 1081.0)  # a new step, seen at 1100
    assert watch.clock(later, now=1100.0) == Reading(False, 0.0, at=1100.0)
    ended = RunView(1, "bert", 4, False, 1000.0, 8, 1081.0)
    assert not watch.clock(ended, now=9999.0).on  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kind", "value", "threshold", "detail", "words"),
    [
        ("scale_below", 0.5, 1.0, "", "scale 0.5 (threshold 1)"),
        ("scale_drop", 9.0, 8.0, "within 100 steps", "9 backoffs within 100 steps (threshold 8)"),
        ("skip_rate", 0.0812, 0.05, "last 200 steps",
         "8.1% of the last 200 steps skipped (threshold 5%)"),
        ("skip_streak", 12.0, 10.0, "", "12 skipped steps in a row (threshold 10)"),
        ("stalled", 185.2, 120.0, "", "no new step for 3 min 5 s (threshold 2 min)"),
        ("stalled", 7.25, 5.0, "", "no new step for 7.25 s (threshold 5 s)"),
        ("rank_hotspot", 7 / 11, 0.6, "last 11 overflows on rank 1",
         "64% of the last 11 overflows on rank 1 (threshold 60%)"),
        ("autopilot", 1.0, 1.0, "no help", "the autopilot stopped: no help"),
        ("schedule_drift", 12.0, 10.0, "steps",
         "schedule ahead of the weights by 12 steps (threshold 10)"),
        ("schedule_drift", 1.0, 1.0, "step",
         "schedule ahead of the weights by 1 step (threshold 1)"),
        ("rank_hotspot", 0.75, 0.6, "", "value 0.75, threshold 0.6"),  # a row from before details
        ("newer_kind", 3.0, 2.0, "x", "value 3, threshold 2 (x)"),
    ],
)  # fmt: skip
def test_each_kind_says_its_value_with_its_unit(
    kind: str, value: float, threshold: float, detail: str, words: str
) -> None:
    assert said(kind, value, threshold, detail) == words


def test_every_kind_has_words_that_fill_in() -> None:
    for name, spec in KINDS.items():
        words = said(name, 1.0, 1.0, "over the window")
        assert "{" not in words and ("over the window" in words) == ("{detail}" in spec.says), name
        assert spec.unit is Unit.FLAG or spec.unit.say(1.0) in words, name


def _collapsing(last: int, every: int, start: float = 2.0**16) -> list[StepView]:
    """A scale halved every ``every`` steps from ``start``, never growing."""
    rows, scale = [], start
    for step in range(1, last + 1):
        after = scale / 2 if step % every == 0 else scale
        rows.append(StepView(step, 1000.0 + step, scale, after, after < scale, after < scale))
        scale = after
    return rows


def test_scale_forecast_fires_before_the_scale_reaches_the_floor() -> None:
    """Halving every 100 steps from 2^16: 1.0 at step 1600. A forecast over 1000 steps with
    a horizon of 500 fires once the floor is 500 steps away at that rate, well before
    scale_below does."""
    rows = _collapsing(1700, every=100)
    turns = _turns("scale_forecast", rows, threshold=500, window=1000)
    assert turns[0][:2] == (1100, True) and turns[0][2] == 500
    below = _turns("scale_below", rows, threshold=1.0)
    assert below[0][:2] == (1700, True) and turns[0][0] < below[0][0]
    # One backoff (as a healthy run has now and then) is no collapse.
    assert _turns("scale_forecast", _steps(backoffs=[30]), threshold=10**6, window=50) == []


def test_scale_forecast_says_the_rate_in_words() -> None:
    spec = KINDS["scale_forecast"]
    watch = spec.watch(spec.params.model_validate({"threshold": 10**6, "window": 1000}), RUN)
    for row in _collapsing(800, every=100):
        reading = watch.step(row)
    assert reading.on
    assert reading.detail == "halving every ~100 steps: 1.0 in ~800 steps at this rate"
    words = said("scale_forecast", reading.value, 10**6, reading.detail)
    assert words.startswith("the scale reaches its floor in ~800 steps: halving every ~100"), words


def test_scale_forecast_reads_the_runs_own_min_scale_unless_a_floor_is_set() -> None:
    """Halving every 100 steps from 2^16: min_scale 2^10 is 10 halvings above 1.0, so a
    run made with it is warned 1000 steps sooner; a rule's own floor wins over it."""
    rows = _collapsing(1700, every=100)
    held = RunView(1, "bert", 4, True, 1000.0, 0, None, min_scale=2.0**10)
    plain = _turns("scale_forecast", rows, threshold=300, window=1000)
    own = _turns("scale_forecast", rows, held, threshold=300, window=1000)
    assert plain[0][:2] == (1300, True) and own[0][:2] == (300, True)
    ruled = _turns("scale_forecast", rows, held, threshold=300, window=1000, floor=1.0)
    assert ruled == plain
