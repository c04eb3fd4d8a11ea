"""Loss and gradient-norm spikes, found where steps are written, with the largest parameter
norms kept at the steps that spiked or overflowed."""

from __future__ import annotations

import math

import pytest

from scalewatch.store import Store
from scalewatch.store.runs import create_run, write_steps
from scalewatch.store.spike_list import ParamNorm, spike_counts, spikes_of
from scalewatch.store.spikes import MIN_HISTORY, SpikeRule, find, rule_of
from tests._helpers.records import step_record
from tests._helpers.stored import CONTROL

NORMS = (("head.weight", 9.0), ("encoder.weight", 2.0))


def _records(steps: range, spikes: dict[int, tuple[float, float]], overflows: set[int]) -> list:
    """A noisy loss near 2 and norm near 1; ``spikes``: step -> (loss, norm) there."""
    out = []
    for step in steps:
        loss, norm = spikes.get(step, (2.0 + 0.01 * (step % 5), 1.0 + 0.02 * (step % 3)))
        out.append(
            step_record(
                step,
                overflow=step in overflows,
                loss=math.inf if step in overflows else loss,
                grad_norm=math.inf if step in overflows else norm,
                param_norms=NORMS,
            )
        )
    return out


def test_a_value_far_above_its_window_spikes_and_a_quiet_one_does_not() -> None:
    rule = SpikeRule(window=50, z=6.0)
    quiet = [1.0 + 0.01 * (i % 7) for i in range(200)]
    assert find(quiet[:100], quiet[100:], rule) == []
    assert [i for i, _ in find(quiet[:100], [*quiet[100:110], 3.0], rule)] == [10]
    assert find(quiet[: MIN_HISTORY - 1], [50.0], rule) == []  # too little history
    assert find([1.0] * 100, [5.0], rule) == []  # no spread: a MAD of 0 flags nothing


def test_a_runs_rule_comes_from_its_config_and_a_bad_one_is_refused() -> None:
    assert rule_of({"spikes": {"window": 50, "z": 4}}) == SpikeRule(50, 4.0)
    assert rule_of({}) == rule_of(None) == SpikeRule(200, 6.0)
    with pytest.raises(ValueError, match="a spike window is 20 to 100000 steps, not 5"):
        SpikeRule(window=5)
    with pytest.raises(ValueError, match="a spike threshold z is a number above 0"):
        SpikeRule(z=float("nan"))


def test_spikes_are_stored_with_their_steps_largest_norms_and_overflows_are_not_spikes(
    store: Store,
) -> None:
    run = create_run(store, name="spiky", world_size=1, config={}, control=CONTROL)
    records = _records(range(1, 401), {150: (9.0, 1.0), 300: (2.0, 40.0)}, {200, 250})
    for first in range(0, len(records), 64):  # in batches, as the writer writes them
        write_steps(store, run.id, records[first : first + 64])

    found = spikes_of(store, run.id)
    assert [(s.step, s.what) for s in found] == [(150, "loss"), (300, "grad_norm")]
    assert found[0].value == 9.0 and found[0].z > 6 and found[1].value == 40.0
    kept = tuple(ParamNorm(name, norm) for name, norm in NORMS)
    assert found[0].params == found[1].params == kept
    assert spike_counts(store, run.id) == {"loss": 1, "grad_norm": 1}
    with store.read() as conn:  # kept at the overflows too, and nowhere else
        steps = conn.exec_driver_sql("SELECT DISTINCT step FROM param_norms ORDER BY step")
        assert [row[0] for row in steps] == [150, 200, 250, 300]

    # A step written again loses its spike: the replayed value is quiet.
    write_steps(store, run.id, _records(range(150, 151), {}, set()))
    assert [s.step for s in spikes_of(store, run.id)] == [300]


def test_a_run_sets_its_own_window_and_threshold(store: Store) -> None:
    config = {"spikes": {"window": 50, "z": 1000.0}}
    run = create_run(store, name="lenient", world_size=1, config=config, control=CONTROL)
    write_steps(store, run.id, _records(range(1, 201), {150: (9.0, 1.0)}, set()))
    assert spikes_of(store, run.id) == []  # a z of some 470: under this run's threshold
