"""The extras over torch's scalers: stats, had_overflow, checkpoints, clamps, hysteresis."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import pytest
import torch

import scalewatch
from tests._helpers.twin import INJECT, Injection, Trace, make_pair, mlp, poison, sgd, train


def ours_cls(kind: str) -> type:
    return scalewatch.GradScaler if kind == "plain" else scalewatch.ShardedGradScaler


def run(gs: Any, steps: int = 16, inject: Injection | None = INJECT, seed: int = 0) -> Trace:
    model = mlp(seed=seed).to(gs._device)
    return train(gs, model, sgd(model), steps=steps, inject=inject)


def expected_stats(init_scale: float, trace: Trace, inject: Injection) -> scalewatch.ScalerStats:
    before = [init_scale, *trace.scales[:-1]]
    seen = [init_scale, *trace.scales]
    return scalewatch.ScalerStats(
        steps=len(trace.scales),
        skipped=sum(trace.skipped),
        overflows=len([s for s in inject if s < len(trace.scales)]),
        growths=sum(a > b for a, b in zip(trace.scales, before, strict=True)),
        backoffs=sum(a < b for a, b in zip(trace.scales, before, strict=True)),
        current_scale=trace.scales[-1],
        min_scale_seen=min(seen),
        max_scale_seen=max(seen),
    )


def test_stats_count_what_torchs_run_shows(kind: str, device: str) -> None:
    kwargs = {"init_scale": 512.0, "growth_factor": 1.7, "backoff_factor": 0.3}
    reference, ours = make_pair(kind, growth_interval=2, device=device, **kwargs)
    theirs = run(reference)
    mine = run(ours)
    mine.assert_same(theirs)
    stats = ours.stats()
    assert stats == expected_stats(512.0, theirs, INJECT)
    assert stats.overflows == stats.skipped == stats.backoffs == 3
    assert stats.growths >= 3
    assert ours.steps == 16


def test_stats_before_any_step(kind: str) -> None:
    _, ours = make_pair(kind, init_scale=8.0)
    assert ours.stats() == scalewatch.ScalerStats(
        current_scale=8.0, min_scale_seen=8.0, max_scale_seen=8.0
    )
    assert not ours.had_overflow()


def test_had_overflow_after_each_update(kind: str, device: str) -> None:
    _, ours = make_pair(kind, init_scale=64.0, growth_interval=2, device=device)
    model = mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for step in range(9):
        trace = train(ours, model, [opt], steps=1, inject={0: INJECT.get(step, [])})
        seen.append(ours.had_overflow())
        assert trace.skipped == [ours.had_overflow()]
    assert seen == [step in INJECT for step in range(9)]


def test_checkpoint_round_trip_continues_identically(kind: str, device: str) -> None:
    kwargs = {"init_scale": 512.0, "growth_factor": 1.7, "backoff_factor": 0.3}
    _, original = make_pair(kind, growth_interval=3, device=device, **kwargs)
    run(original, steps=7)
    checkpoint = original.checkpoint()
    assert isinstance(checkpoint, scalewatch.ScalerCheckpoint)
    assert checkpoint.scale == original.get_scale()
    assert checkpoint.growth_tracker == original._get_growth_tracker()
    assert (checkpoint.growth_factor, checkpoint.backoff_factor) == (1.7, 0.3)
    assert (checkpoint.growth_interval, checkpoint.step) == (3, 7)
    assert scalewatch.ScalerCheckpoint.from_dict(checkpoint.to_dict()) == checkpoint

    _, restored = make_pair(kind, device=device)
    restored.load_checkpoint(checkpoint)
    assert restored.checkpoint() == checkpoint
    after_restore = run(restored, steps=9, inject={2: [(0, float("inf"))]}, seed=3)
    after_original = run(original, steps=9, inject={2: [(0, float("inf"))]}, seed=3)
    after_restore.assert_same(after_original)
    assert restored.steps == original.steps == 16


def test_checkpoint_keeps_the_extras(kind: str) -> None:
    ours = ours_cls(kind)(
        "cpu", init_scale=8.0, min_scale=2.0, max_scale=64.0, hysteresis=3, telemetry=False
    )
    run(ours, steps=4, inject={1: [(0, float("inf"))]})
    checkpoint = ours.checkpoint()
    assert (checkpoint.min_scale, checkpoint.max_scale) == (2.0, 64.0)
    assert (checkpoint.hysteresis, checkpoint.hysteresis_tracker) == (3, 2)
    fresh = ours_cls(kind)("cpu", telemetry=False)
    fresh.load_checkpoint(checkpoint)
    assert (fresh.min_scale, fresh.max_scale, fresh.hysteresis) == (2.0, 64.0, 3)
    assert fresh.checkpoint() == checkpoint


def test_min_scale_stops_repeated_overflows_at_the_floor(kind: str, device: str) -> None:
    every_step = {s: [(0, float("inf"))] for s in range(8)}
    kwargs = {"init_scale": 8.0, "backoff_factor": 1e-9}
    reference, _ = make_pair(kind, device=device, **kwargs)
    ours = ours_cls(kind)(device, min_scale=0.5, telemetry=False, **kwargs)
    theirs = run(reference, steps=8, inject=every_step)
    mine = run(ours, steps=8, inject=every_step)
    assert theirs.scales[-1] == 0.0  # torch's scale collapses to zero
    assert mine.scales == [0.5] * 8
    assert mine.skipped == theirs.skipped == [True] * 8
    assert ours.stats().min_scale_seen == 0.5


def test_max_scale_caps_growth(kind: str, device: str) -> None:
    kwargs = {"init_scale": 1.0, "growth_factor": 1000.0, "growth_interval": 1}
    reference, _ = make_pair(kind, device=device, **kwargs)
    ours = ours_cls(kind)(device, max_scale=1e6, telemetry=False, **kwargs)
    theirs = run(reference, steps=6, inject=None)
    mine = run(ours, steps=6, inject=None)
    assert theirs.scales[:3] == [1e3, 1e6, pytest.approx(1e9)]
    assert mine.scales == [1e3, 1e6, 1e6, 1e6, 1e6, 1e6]
    assert ours.stats().max_scale_seen == 1e6


def f32(x: float) -> float:
    """Round to float32, as the scale tensor stores it."""
    rounded: float = struct.unpack("f", struct.pack("f", x))[0]
    return rounded


def megatron(
    init_scale: float,
    overflows: list[bool],
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    hysteresis: int,
    float32_math: bool,
) -> list[tuple[float, int]]:
    """Megatron's DynamicGradScaler rule: (scale, growth tracker) after each step.

    Rounded as the torch class underneath rounds: its kernel multiplies in double
    and rounds once (cpu and cuda); torch's sharded class multiplies cpu scales in float32.
    """

    def times(scale: float, factor: float) -> float:
        return f32(scale * f32(factor)) if float32_math else f32(scale * factor)

    scale, tracker, hyst = f32(init_scale), 0, hysteresis
    out = []
    for overflow in overflows:
        if overflow:
            tracker = 0
            hyst -= 1
            if hyst <= 0:
                scale = times(scale, backoff_factor)
        else:
            tracker += 1
            if tracker == growth_interval:
                tracker = 0
                hyst = hysteresis
                scale = times(scale, growth_factor)
        out.append((scale, tracker))
    return out


@pytest.mark.parametrize("hysteresis", [2, 3])
def test_hysteresis_follows_megatrons_rule(kind: str, device: str, hysteresis: int) -> None:
    inject = {s: [(s % 4, float("inf"))] for s in (1, 2, 3, 4, 8, 9, 15, 17, 18, 19)}
    factors = {"growth_factor": 1.7, "backoff_factor": 0.3, "growth_interval": 3}
    ours = ours_cls(kind)(
        device, init_scale=1024.0, hysteresis=hysteresis, telemetry=False, **factors
    )
    trace = run(ours, steps=22, inject=inject)
    expected = megatron(
        1024.0,
        [s in inject for s in range(22)],
        hysteresis=hysteresis,
        float32_math=kind == "sharded" and device == "cpu",
        **factors,
    )
    assert list(zip(trace.scales, trace.trackers, strict=True)) == expected
    assert trace.skipped == [s in inject for s in range(22)]
    stats = ours.stats()
    assert stats.overflows == stats.skipped == 10
    assert stats.backoffs < 10  # hysteresis absorbed some overflows


def test_hysteresis_one_equals_torch(kind: str, device: str) -> None:
    factors = {"init_scale": 512.0, "growth_factor": 1.7, "backoff_factor": 0.3}
    reference, _ = make_pair(kind, growth_interval=2, device=device, **factors)
    ours = ours_cls(kind)(device, growth_interval=2, hysteresis=1, telemetry=False, **factors)
    run(ours).assert_same(run(reference))


def clean_steps(gs: Any, model: torch.nn.Module, opt: Any, steps: int) -> list[float]:
    return train(gs, model, [opt], steps=steps).scales


def test_lowering_growth_interval_below_the_tracker_grows_next_clean_step(
    kind: str, device: str
) -> None:
    reference, ours = make_pair(kind, init_scale=16.0, growth_interval=10, device=device)
    scales = {}
    for name, gs in (("torch", reference), ("ours", ours)):
        model = mlp().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        assert clean_steps(gs, model, opt, 5) == [16.0] * 5
        assert gs._get_growth_tracker() == 5
        gs.set_growth_interval(3)
        scales[name] = clean_steps(gs, model, opt, 7)
    # torch's kernel grows only when tracker + 1 == interval: past it, growth stalls
    assert scales["torch"] == [16.0] * 7
    assert reference._get_growth_tracker() == 12
    assert scales["ours"] == [32.0, 32.0, 32.0, 64.0, 64.0, 64.0, 128.0]


def test_defaults_equal_torchs(kind: str) -> None:
    reference, ours = make_pair(kind)
    assert ours.get_scale() == reference.get_scale() == 2.0**16
    assert ours.get_growth_factor() == reference.get_growth_factor() == 2.0
    assert ours.get_backoff_factor() == reference.get_backoff_factor() == 0.5
    assert ours.get_growth_interval() == reference.get_growth_interval() == 2000
    assert ours._get_growth_tracker() == reference._get_growth_tracker() == 0
    assert ours.is_enabled() and reference.is_enabled()
    assert (ours.min_scale, ours.max_scale, ours.hysteresis) == (None, None, None)
    assert ours.state_dict().keys() - reference.state_dict().keys() == {"scalewatch"}
    run(ours, steps=10).assert_same(run(reference, steps=10))


def test_default_device_is_cuda_and_disables_without_it_as_torch(kind: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the scalers stay enabled")
    cls = torch.amp.GradScaler if kind == "plain" else make_pair(kind)[0].__class__
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling."):
        assert not cls().is_enabled()
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling."):
        assert not ours_cls(kind)(telemetry=False).is_enabled()


INF = float("inf")


def test_a_hysteresis_tracker_at_zero_survives_a_resume(kind: str) -> None:
    original = ours_cls(kind)("cpu", init_scale=64.0, hysteresis=2, telemetry=False)
    run(original, steps=3, inject={1: [(0, INF)], 2: [(0, INF)]})  # the second one backs off
    assert original.checkpoint().hysteresis_tracker == 0
    by_state_dict = ours_cls(kind)("cpu", telemetry=False)
    by_state_dict.load_state_dict(original.state_dict())
    by_checkpoint = ours_cls(kind)("cpu", telemetry=False)
    by_checkpoint.load_checkpoint(original.checkpoint())
    by_pickle = pickle.loads(pickle.dumps(original))
    # With the tracker at 0 the next overflow backs off again; restored as 2 it would not.
    expected = run(original, steps=1, inject={0: [(0, INF)]})
    assert expected.scales == [16.0]
    for restored in (by_state_dict, by_checkpoint, by_pickle):
        run(restored, steps=1, inject={0: [(0, INF)]}).assert_same(expected)


def test_setters_of_a_disabled_scaler_work_as_torchs(kind: str) -> None:
    reference, ours = make_pair(kind, enabled=False)
    for gs in (reference, ours):
        gs.set_growth_factor(3.0)
        gs.set_backoff_factor(0.25)
        gs.set_growth_interval(7)
    getters = ("get_growth_factor", "get_backoff_factor", "get_growth_interval")
    assert [getattr(ours, g)() for g in getters] == [getattr(reference, g)() for g in getters]
    assert [getattr(ours, g)() for g in getters] == [3.0, 0.25, 7]
    with pytest.raises(ValueError, match="growth_factor"):
        ours.set_growth_factor(0.5)
    assert ours.state_dict() == reference.state_dict() == {}
    with pytest.raises(RuntimeError, match="disabled"):
        ours.checkpoint()


def test_setters_keep_the_factors_type_as_torchs(kind: str) -> None:
    """An int factor stays an int, as torch's setters keep it; the store gets a float."""
    reference, ours = make_pair(kind, growth_interval=1)
    for gs in (reference, ours):
        gs.set_growth_factor(3)
        gs.set_backoff_factor(0.25)
    assert type(ours.get_growth_factor()) is type(reference.get_growth_factor()) is int
    assert ours.state_dict()["growth_factor"] == reference.state_dict()["growth_factor"] == 3
    run(ours, steps=2, inject=None).assert_same(run(reference, steps=2, inject=None))
    assert ours.get_scale() == 2.0**16 * 9  # grew by 3, twice


def test_an_update_with_a_new_scale_still_counts_the_overflow(kind: str) -> None:
    _, ours = make_pair(kind, init_scale=64.0)
    model = mlp()
    opt = sgd(model)[0]

    def step(inject: bool, new_scale: float) -> bool:
        opt.zero_grad()
        ours.scale(model(torch.ones(3, 4)).pow(2).mean()).backward()
        if inject:
            poison(list(model.parameters()), 0, INF)
        before = [p.detach().clone() for p in model.parameters()]
        ours.step(opt)
        ours.update(new_scale=new_scale)
        return all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    assert step(True, 8.0)  # skipped
    assert ours.had_overflow() and ours.get_scale() == 8.0
    assert not step(False, 4.0)
    assert not ours.had_overflow() and ours.get_scale() == 4.0
    stats = ours.stats()
    assert (stats.steps, stats.overflows, stats.skipped) == (2, 1, 1)
    assert (stats.growths, stats.backoffs) == (0, 0)  # set, not grown or backed off
    ours.scale(torch.ones(()))
    ours.update(new_scale=2.0)  # no inf checks this step: as torch, no complaint
    assert ours.get_scale() == 2.0 and not ours.had_overflow()


def test_min_and_max_scale_hold_for_init_scale_new_scale_and_loads(kind: str) -> None:
    low = ours_cls(kind)("cpu", init_scale=1.0, min_scale=2.0, max_scale=64.0, telemetry=False)
    assert low.get_scale() == 2.0
    low.scale(torch.ones(()))
    assert low.get_scale() == 2.0
    low.update(new_scale=0.0)
    assert low.get_scale() == 2.0
    low.scale(torch.ones(()))
    low.update(new_scale=torch.tensor(1e30))
    assert low.get_scale() == 64.0
    state = low.state_dict()
    low.load_state_dict({**state, "scale": 1e-6})
    assert low.get_scale() == 2.0
    high = ours_cls(kind)("cpu", init_scale=1024.0, max_scale=64.0, telemetry=False)
    assert high.get_scale() == 64.0
    assert run(high, steps=1, inject={}).scales == [64.0]


def test_one_element_tensor_arguments_are_taken_as_torch_takes_them(kind: str) -> None:
    reference, ours = make_pair(
        kind,
        init_scale=torch.tensor(512.0),
        growth_factor=torch.tensor(1.5),
        backoff_factor=torch.tensor(0.25),
        growth_interval=torch.tensor(2),
    )
    run(ours).assert_same(run(reference))
    assert ours.get_growth_interval() == 2 and isinstance(ours.get_growth_interval(), int)


def test_a_checkpoint_carries_the_control_version(kind: str) -> None:
    _, ours = make_pair(kind)
    run(ours, steps=1, inject={})
    ours.set_growth_factor(3.0)
    ours.set_backoff_factor(0.25)
    run(ours, steps=1, inject={})
    checkpoint = ours.checkpoint()
    assert checkpoint.control_version == 2
    _, restored = make_pair(kind)
    restored.load_checkpoint(checkpoint)
    assert restored.state_dict()["scalewatch"]["control_version"] == 2
