"""``skip_on_spike``: a spiking step is skipped as if its optimizer step were left out.

The referee is torch's own scaler running the same loop with the spiking steps' optimizer
steps left out by hand (``unscale_``, then ``update()`` without ``step()``): ours, told to
skip on spikes, must leave the parameters, the optimizers' state, the scale and the growth
tracker bit-identical to it after every step. That proves the skip (nothing moved), that
the scale was not backed off for it (torch's update saw a clean step), and that the
other steps, overflows included, are torch's. Plain loops and ``ShardedGradScaler`` in a
world of one, SGD, foreach and fused Adam, ``unscale_`` before ``step`` (clipping) or
not, and gradient accumulation. (Two real ranks: ``test_spike_skip_multirank.py``; no
added read: ``test_sync_count.py``.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch
from scalewatch.store.spikes import MIN_HISTORY
from tests._helpers.twin import (
    batch,
    mlp,
    poison,
    skip_unless_torchs_sharded_steps_fused_overflows,
    world1,
)
from tests.scaler._kept_samples import keep_samples

STEPS = 34
SPIKES = (26, 31)  # a batch whose target is far off: its loss and its gradient norm spike
OVERFLOW = 29  # inf in a gradient: an overflow, backed off, and no spike
KWARGS: dict[str, Any] = {"init_scale": 2.0**10, "growth_interval": 4}

Optimizers = Callable[[nn.Module], torch.optim.Optimizer]
OPTIMIZERS: dict[str, Optimizers] = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.001, momentum=0.9),
    "foreach-adam": lambda m: torch.optim.Adam(m.parameters(), lr=0.001, foreach=True),
    "fused-adam": lambda m: torch.optim.Adam(m.parameters(), lr=0.001, fused=True),
}


def micro_batches(step: int, accumulate: int) -> Iterator[tuple[torch.Tensor, float]]:
    """A step's micro-batches, each (input, target); at a spike, the last one's target is
    a hundred times the others'."""
    for micro in range(accumulate):
        spike = step in SPIKES and micro == accumulate - 1
        yield batch(step * accumulate + micro), 100.0 if spike else 1.0


def run(
    gs: Any,
    optimizer: str,
    *,
    left_out: tuple[int, ...] = (),
    accumulate: int = 1,
    clip: bool = False,
    overflow: bool = True,
) -> dict[str, Any]:
    """Train ``STEPS`` steps; the steps in ``left_out`` unscale and update, never step (the
    reference's spikes). Returns every step's scale, tracker and parameters, and the end's
    optimizer state."""
    model = mlp()
    opt = OPTIMIZERS[optimizer](model)
    params = list(model.parameters())
    out: dict[str, Any] = {"scales": [], "trackers": [], "params": [], "said": []}
    for step in range(STEPS):
        opt.zero_grad()
        for x, target in micro_batches(step, accumulate):
            gs.scale(model(x).sub(target).pow(2).mean() / accumulate).backward()
        if overflow and step == OVERFLOW:
            poison(params, 0, math.inf)
        if clip or step in left_out:
            gs.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(params, max_norm=1e9)  # unscaled, left as they are
        if step not in left_out:
            gs.step(opt)
        gs.update()
        out["scales"].append(gs.get_scale())
        out["trackers"].append(gs._get_growth_tracker())
        out["params"].append([p.detach().clone() for p in params])
        out["said"].append(getattr(gs, "last_step_skipped", None))
    out["state"] = [
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for s in opt.state.values()
    ]
    return out


def assert_same(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours["scales"] == theirs["scales"]
    assert ours["trackers"] == theirs["trackers"]
    for step, (mine, reference) in enumerate(zip(ours["params"], theirs["params"], strict=True)):
        assert all(torch.equal(a, b) for a, b in zip(mine, reference, strict=True)), step
    for mine, reference in zip(ours["state"], theirs["state"], strict=True):
        assert mine.keys() == reference.keys()
        for key in mine:
            assert torch.equal(torch.as_tensor(mine[key]), torch.as_tensor(reference[key])), key


def pair(kind: str) -> tuple[Any, Any]:
    if kind == "plain":
        return torch.amp.GradScaler("cpu", **KWARGS), scalewatch.GradScaler(
            "cpu", telemetry=False, **KWARGS
        )
    return TorchSharded("cpu", **KWARGS), scalewatch.ShardedGradScaler(
        "cpu", telemetry=False, **KWARGS
    )


def compare(kind: str, optimizer: str, **options: Any) -> dict[str, Any]:
    reference, ours = pair(kind)
    ours.skip_on_spike(grad_norm_z=20.0, loss_z=20.0)
    try:
        theirs = run(reference, optimizer, left_out=SPIKES, **options)
    except RuntimeError as error:  # a cpu fused Adam after a sharded unscale_: torch's fails
        pytest.skip(f"no reference: torch {torch.__version__}'s own scaler fails: {error}")
    mine = run(ours, optimizer, **options)
    assert_same(mine, theirs)
    skipped = [step for step, said in enumerate(mine["said"]) if said]
    want = sorted((*SPIKES, *((OVERFLOW,) if options.get("overflow", True) else ())))
    assert skipped == want
    stats = ours.stats()
    assert (stats.spike_skips, stats.skipped) == (len(SPIKES), len(want))
    assert stats.overflows == (len(want) - len(SPIKES))
    return mine


@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale-then-step"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_plain_skips_the_spikes_as_torch_without_those_steps(optimizer: str, clip: bool) -> None:
    compare("plain", optimizer, clip=clip)


@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale-then-step"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_sharded_skips_the_spikes_as_torch_without_those_steps(optimizer: str, clip: bool) -> None:
    if optimizer == "fused-adam":
        skip_unless_torchs_sharded_steps_fused_overflows()
    with world1():
        compare("sharded", optimizer, clip=clip)


@pytest.mark.parametrize("kind", ["plain", "sharded"])
def test_gradient_accumulation_judges_the_steps_loss_and_norm(kind: str) -> None:
    with world1():
        compare(kind, "sgd", accumulate=3)


def test_a_scaler_not_told_to_skip_steps_every_spike_as_torch() -> None:
    reference, ours = pair("plain")
    assert_same(run(ours, "sgd"), run(reference, "sgd"))
    assert ours.stats().spike_skips == 0


@pytest.mark.parametrize(
    ("grad_norm_z", "loss_z"), [(20.0, None), (None, 20.0)], ids=["norm-alone", "loss-alone"]
)
def test_either_signal_alone_skips(grad_norm_z: float | None, loss_z: float | None) -> None:
    reference, ours = pair("plain")
    ours.skip_on_spike(grad_norm_z=grad_norm_z, loss_z=loss_z)
    assert_same(
        run(ours, "sgd", overflow=False), run(reference, "sgd", left_out=SPIKES, overflow=False)
    )
    assert ours.stats().spike_skips == len(SPIKES)


def test_the_environment_turns_it_on_for_a_scaler_built_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``$SCALEWATCH_SKIP_ON_SPIKE`` (``scalewatch instrument --skip-on-spike``): a scaler
    that a framework builds skips as one told by ``skip_on_spike``."""
    monkeypatch.setenv("SCALEWATCH_SKIP_ON_SPIKE", "grad_norm_z=20")
    reference, ours = pair("plain")
    assert_same(
        run(ours, "sgd", overflow=False), run(reference, "sgd", left_out=SPIKES, overflow=False)
    )
    assert ours.stats().spike_skips == len(SPIKES)


@pytest.mark.parametrize("text", ["grad_norm_z", "loss_z=0", "z=3", "loss_z=2,loss_z=3", "x"])
def test_an_environment_it_cannot_read_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("SCALEWATCH_SKIP_ON_SPIKE", text)
    with pytest.raises(ValueError, match=r"^\$SCALEWATCH_SKIP_ON_SPIKE takes grad_norm_z=Z") as e:
        scalewatch.GradScaler("cpu", telemetry=False)
    assert "\n" not in str(e.value)


def test_nothing_is_skipped_before_the_window_holds_enough_values() -> None:
    assert min(SPIKES) >= MIN_HISTORY
    early = (5, 12, MIN_HISTORY - 1)  # the last: its window holds MIN_HISTORY - 1 values
    _, ours = pair("plain")
    ours.skip_on_spike(grad_norm_z=20.0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(MIN_HISTORY):
        opt.zero_grad()
        target = 100.0 if step in early else 1.0
        ours.scale(model(batch(step)).sub(target).pow(2).mean()).backward()
        ours.step(opt)
        ours.update()
        assert ours.last_step_skipped is False, step


class Recorded(scalewatch.GradScaler):
    def _reset_transient(self) -> None:
        super()._reset_transient()
        self.samples = keep_samples(self)


def test_the_record_says_skipped_for_a_spike_apart_from_overflows() -> None:
    gs = Recorded("cpu", **KWARGS)
    gs.skip_on_spike(grad_norm_z=20.0)
    run(gs, "sgd")
    assert gs.flush()
    records = [sample.record for sample in gs.samples]
    assert [r.step for r in records if r.spike_skipped] == [s + 1 for s in SPIKES]
    assert [r.step for r in records if r.overflow] == [OVERFLOW + 1]
    assert [r.step for r in records if r.skipped] == sorted(s + 1 for s in (*SPIKES, OVERFLOW))
    for record in records:
        if record.spike_skipped:  # the scale was kept, not backed off
            assert not record.overflow and record.scale_after >= record.scale
    gs.close()


def test_held_schedulers_hold_on_a_spike() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False, **KWARGS)
    gs.skip_on_spike(grad_norm_z=20.0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    held = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 / (1 + epoch))
    gs.hold(held)
    for step in range(STEPS):
        opt.zero_grad()
        x, target = next(micro_batches(step, 1))
        gs.scale(model(x).sub(target).pow(2).mean()).backward()
        gs.step(opt)
        gs.update()
        held.step()
    assert held.last_epoch == STEPS - len(SPIKES)


def test_a_copy_keeps_the_rule_and_starts_its_windows_empty() -> None:
    import pickle

    gs = scalewatch.GradScaler("cpu", telemetry=False, **KWARGS)
    gs.skip_on_spike(grad_norm_z=6.0, loss_z=7.0)
    copy = pickle.loads(pickle.dumps(gs))
    assert copy._spike_skip is not None and copy._spike_skip.rule == gs._spike_skip.rule
    assert copy.last_grad_norm is None and copy._grad_norm.on


@pytest.mark.parametrize("z", [0, -1.0, math.inf, math.nan, "6", True])
def test_a_threshold_that_is_no_number_above_0_is_refused(z: Any) -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    with pytest.raises(ValueError, match="grad_norm_z is a number above 0"):
        gs.skip_on_spike(grad_norm_z=z)
    with pytest.raises(ValueError, match="loss_z is a number above 0"):
        gs.skip_on_spike(loss_z=z)


def test_off_by_default_and_turned_off_by_no_threshold() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    assert gs._spike_skip is None and not gs._grad_norm.on
    gs.skip_on_spike(grad_norm_z=5.0)
    assert gs._spike_skip is not None and gs._grad_norm.on  # the norm is measured for it
    gs.skip_on_spike()
    assert gs._spike_skip is None


def test_the_device_rule_is_the_services_median_and_mad() -> None:
    """Each step's decision is the service's robust z over the values before it (numpy's
    median and MAD, float64), on a series with spikes of either sign and an overflow."""
    import numpy as np

    from scalewatch._spike_skip import SkipRule, SpikeSkip
    from scalewatch.store.spikes import MAD_TO_SIGMA

    rng = np.random.default_rng(5)
    values = rng.lognormal(0.0, 0.3, 120)
    values[[40, 77, 101]] *= 12.0  # spikes
    values[60] /= 12.0  # a dip: no spike
    overflowed = {90}
    skip = SpikeSkip(SkipRule(grad_norm_z=5.0, loss_z=None, window=50))
    kept: list[float] = []
    flagged = []
    for step, value in enumerate(values):
        found = torch.tensor(1.0 if step in overflowed else 0.0)
        flag = skip.decide(torch.tensor(value, dtype=torch.float32), None, found)
        window = np.asarray(kept[-50:], dtype=np.float32).astype(np.float64)
        want = False
        if len(window) >= MIN_HISTORY and step not in overflowed:
            median = np.median(window)
            mad = np.median(np.abs(window - median))
            want = bool(mad > 0 and (np.float32(value) - median) / (MAD_TO_SIGMA * mad) > 5.0)
        assert bool(flag.item()) == want, step
        if want:
            flagged.append(step)
        skip.finish(found)
        if step not in overflowed:
            kept.append(float(value))
    assert flagged == [40, 77, 101]


def test_a_spike_skip_is_stored_apart_from_overflows_and_counted_in_the_series(
    kind: str, tmp_path: Path
) -> None:
    from sqlalchemy import select

    from scalewatch.store import open_store
    from scalewatch.store.queries import chart_series
    from scalewatch.store.schema import steps

    url = f"sqlite:///{tmp_path / 'sw.db'}"
    cls = scalewatch.GradScaler if kind == "plain" else scalewatch.ShardedGradScaler
    gs = cls("cpu", telemetry=url, run_name="spiky", **KWARGS)
    gs.skip_on_spike(grad_norm_z=20.0)
    run(gs, "sgd")
    assert gs.flush()
    run_id = gs.run_id
    assert run_id is not None
    gs.close()
    with open_store(url) as store:
        with store.read() as conn:
            rows = {r.step: r for r in conn.execute(select(steps).where(steps.c.run_id == run_id))}
        series = chart_series(store, run_id, max_points=2).columns
    spikes = [s + 1 for s in SPIKES]  # a record's step counts update() calls from 1
    assert [s for s, r in rows.items() if r.spike_skipped] == spikes
    assert [s for s, r in rows.items() if r.overflow] == [OVERFLOW + 1]
    assert [s for s, r in rows.items() if r.skipped] == sorted((*spikes, OVERFLOW + 1))
    assert sum(series["spike_skips"]) == len(SPIKES)
    assert sum(series["skipped"]) == len(SPIKES) + 1
    assert sum(series["overflows"]) == 1
