"""Where a run's scale is heading: read from a window of its steps, in words."""

from __future__ import annotations

from scalewatch.store.engine import Store
from scalewatch.store.forecast import ScaleStep, read_forecast, recent_scale_changes
from tests._helpers.service import add_run, simulate


def _halving(last: int, every: int, start: float = 2.0**16) -> list[ScaleStep]:
    rows, scale = [], start
    for step in range(1, last + 1):
        after = scale / 2 if step % every == 0 else scale
        rows.append(ScaleStep(step, scale, after))
        scale = after
    return rows


def test_a_falling_scale_says_how_fast_and_when_it_reaches_the_floor() -> None:
    found = read_forecast(_halving(1240, every=310), floor=1.0)
    assert found is not None and found.trend == "falling"
    assert found.text == "halving every ~310 steps: 1.0 in ~3,700 steps at this rate"
    assert (found.first_step, found.last_step, found.steps_to_floor) == (1, 1240, 3720)
    with_floor = read_forecast(_halving(1240, every=310), floor=2.0**10)
    assert with_floor is not None and with_floor.steps_to_floor == 620


def test_a_rising_steady_and_pinned_scale() -> None:
    rising = [ScaleStep(s, 2.0**s, 2.0 ** (s + 1)) for s in range(1, 5)]
    found = read_forecast(rising, ceiling=2.0**24)
    assert found is not None and found.trend == "rising"
    assert found.text == "doubling every ~1 steps: max_scale in ~19 steps"
    steady = [ScaleStep(1, 2.0**17, 2.0**17), ScaleStep(900, 2.0**17, 2.0**16),
              ScaleStep(1900, 2.0**16, 2.0**17), ScaleStep(2000, 2.0**17, 2.0**17)]  # fmt: skip
    found = read_forecast(steady)
    assert found is not None and (found.trend, found.text) == ("steady", "steady near 2^17")
    pinned = [ScaleStep(1, 2.0**23, 2.0**24), ScaleStep(12_001, 2.0**24, 2.0**24)]
    found = read_forecast(pinned, ceiling=2.0**24)
    assert found is not None and found.trend == "pinned"
    assert found.text == "pinned at max_scale for 12,000 steps"
    assert read_forecast(pinned[:1]) is None


def test_a_scale_under_one_is_said_plainly() -> None:
    found = read_forecast(_halving(2000, every=100, start=2.0**4), floor=2.0**-10)
    assert found is not None and found.scale == 2.0**-16 and found.steps_to_floor == 0
    assert found.text.endswith(
        "; the scale is 1.53e-05, under 1: the gradients are made smaller"
    ), found.text


def test_the_store_gives_the_windows_changes_and_bounds(store: Store) -> None:
    run = add_run(store, simulate(3000, {2500, 2600, 2700}, interval=10**9))
    rows = recent_scale_changes(store, run, last_step=3000, window=1000)
    assert [(r.step, r.scale_after) for r in rows] == [
        (2001, 2.0**16), (2500, 2.0**15), (2600, 2.0**14), (2700, 2.0**13), (3000, 2.0**13)
    ]  # fmt: skip
    found = read_forecast(rows)
    assert found is not None and found.trend == "falling" and found.halving_steps == 1000 / 3
    assert recent_scale_changes(store, run + 1, last_step=10) == []
