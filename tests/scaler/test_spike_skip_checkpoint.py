"""``skip_on_spike``'s windows survive a checkpoint: a resumed job needs no new warm-up.

A run is cut after ``CUT`` steps, its scaler's ``state_dict()`` saved and loaded (through
``torch.save`` and ``torch.load(weights_only=True)``, as a checkpoint is) into a new
scaler, and training goes on with the same model and optimizer. The resumed run must
decide every step as the unbroken one does (both spikes skipped, the first two steps after
the cut: a window started empty holds one value there and skips nothing), and leave the
same parameters, scale and tracker; whether ``skip_on_spike`` is called before or after
the load. The windows ride under our own key, which torch's ``load_state_dict`` leaves
unread: torch's scalers load our dicts (scale and tracker as ours), and ours load torch's
(windows empty, as before any step).
"""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch
from scalewatch.store.spikes import MIN_HISTORY
from tests._helpers.twin import batch, mlp

STEPS = MIN_HISTORY + 10
CUT = MIN_HISTORY + 2  # the windows hold MIN_HISTORY values and more here
SPIKES = (CUT + 1, CUT + 5)  # the first: the second step after the cut
KWARGS: dict[str, Any] = {"init_scale": 2.0**10, "growth_interval": 4}
RULE: dict[str, float] = {"grad_norm_z": 20.0, "loss_z": 20.0}
KINDS = {"plain": scalewatch.GradScaler, "sharded": scalewatch.ShardedGradScaler}


class Training:
    """A model, its optimizer and the steps trained so far, for one scaler after another."""

    def __init__(self) -> None:
        self.model = mlp()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.001, momentum=0.9)
        self.step = 0

    def train(self, gs: Any, until: int) -> list[bool]:
        """Steps up to ``until``; whether each was skipped."""
        said = []
        while self.step < until:
            self.opt.zero_grad()
            target = 100.0 if self.step in SPIKES else 1.0
            gs.scale(self.model(batch(self.step)).sub(target).pow(2).mean()).backward()
            gs.step(self.opt)
            gs.update()
            said.append(gs.last_step_skipped)
            self.step += 1
        return said

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


def saved(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` through a checkpoint file, loaded as torch loads one by default."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


def same_window(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same values in the same places, NaN (empty) included."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def unbroken(kind: str) -> tuple[list[bool], Training, Any]:
    gs = KINDS[kind]("cpu", telemetry=False, **KWARGS)
    gs.skip_on_spike(**RULE)
    training = Training()
    return training.train(gs, STEPS), training, gs


def resumed(kind: str, rule_first: bool, keep_windows: bool = True) -> tuple[list[bool], Any]:
    """Train to ``CUT``, checkpoint, resume in a new scaler (``skip_on_spike`` before the
    load, or after it), train on."""
    training = Training()
    before = KINDS[kind]("cpu", telemetry=False, **KWARGS)
    before.skip_on_spike(**RULE)
    said = training.train(before, CUT)
    state = saved(before.state_dict())
    if not keep_windows:
        del state["scalewatch"]["spike_windows"]
    after = KINDS[kind]("cpu", telemetry=False, **KWARGS)
    if rule_first:
        after.skip_on_spike(**RULE)
    after.load_state_dict(state)
    if not rule_first:
        after.skip_on_spike(**RULE)
    said += training.train(after, STEPS)
    return said, (training, after)


@pytest.mark.parametrize("rule_first", [True, False], ids=["rule-then-load", "load-then-rule"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_resumed_run_skips_the_next_spike_at_once_as_the_unbroken_one(
    kind: str, rule_first: bool
) -> None:
    said, training, gs = unbroken(kind)
    assert [step for step, s in enumerate(said) if s] == list(SPIKES)
    again, (training_again, gs_again) = resumed(kind, rule_first)
    assert again == said
    for mine, reference in zip(training_again.params(), training.params(), strict=True):
        assert torch.equal(mine, reference)
    assert gs_again.get_scale() == gs.get_scale()
    assert gs_again._get_growth_tracker() == gs._get_growth_tracker()
    assert gs_again.stats().spike_skips == len(SPIKES)  # its own steps: both after the cut
    # and its state is the unbroken run's: windows, oldest first, equal
    ours, theirs = gs_again.state_dict()["scalewatch"], gs.state_dict()["scalewatch"]
    assert ours["spike_windows"].keys() == {"grad_norm", "loss"}
    for name, window in theirs["spike_windows"].items():
        assert same_window(ours["spike_windows"][name], window), name


def test_without_the_windows_a_resumed_run_warms_up_again() -> None:
    """What the windows are for: a dict without them (torch's, or ours from before) starts
    empty, and the spike right after the cut goes through."""
    said, _ = resumed("plain", rule_first=True, keep_windows=False)
    assert [step for step, s in enumerate(said) if s] == []


def test_the_windows_are_the_last_values_oldest_first() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False, **KWARGS)
    gs.skip_on_spike(grad_norm_z=20.0)  # the norm's window alone
    Training().train(gs, 3)
    windows = gs.state_dict()["scalewatch"]["spike_windows"]
    assert windows.keys() == {"grad_norm"}
    window = windows["grad_norm"]
    assert window.dtype == torch.float32 and window.device.type == "cpu"
    assert window.shape == (200,)  # the default spikes window
    assert bool(window[:-3].isnan().all()) and bool(window[-3:].isfinite().all())


def test_a_dict_from_before_any_step_has_no_windows() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False, **KWARGS)
    gs.skip_on_spike(**RULE)
    assert "spike_windows" not in gs.state_dict()["scalewatch"]
    plain = scalewatch.GradScaler("cpu", telemetry=False, **KWARGS)  # no skip_on_spike
    assert "spike_windows" not in plain.state_dict()["scalewatch"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_torchs_scaler_loads_our_dict_with_windows_and_ours_loads_torchs(kind: str) -> None:
    ours = KINDS[kind]("cpu", telemetry=False, **KWARGS)
    ours.skip_on_spike(**RULE)
    Training().train(ours, CUT)
    state = saved(ours.state_dict())
    assert "spike_windows" in state["scalewatch"]
    theirs: Any = (
        torch.amp.GradScaler("cpu", **KWARGS) if kind == "plain" else TorchSharded("cpu", **KWARGS)
    )
    theirs.load_state_dict(state)  # our key left unread
    assert theirs.get_scale() == ours.get_scale()
    assert theirs._get_growth_tracker() == ours._get_growth_tracker()
    theirs_state = saved(theirs.state_dict())
    fresh = KINDS[kind]("cpu", telemetry=False, **KWARGS)
    fresh.skip_on_spike(**RULE)
    fresh.load_state_dict(theirs_state)
    assert fresh.get_scale() == ours.get_scale()
    assert "spike_windows" not in fresh.state_dict()["scalewatch"]  # started empty
    # and a scaler that held windows, loaded with torch's dict, starts them empty too
    ours.load_state_dict(theirs_state)
    assert "spike_windows" not in ours.state_dict()["scalewatch"]


def test_windows_loaded_into_a_scaler_that_skips_nothing_are_kept_for_its_dict() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False, **KWARGS)
    gs.skip_on_spike(**RULE)
    Training().train(gs, CUT)
    state = saved(gs.state_dict())
    passing = scalewatch.GradScaler("cpu", telemetry=False, **KWARGS)
    passing.load_state_dict(state)  # no skip_on_spike: the windows are handed on unchanged
    again = passing.state_dict()["scalewatch"]["spike_windows"]
    for name, window in state["scalewatch"]["spike_windows"].items():
        assert same_window(again[name], window), name
    assert math.isnan(float(again["loss"][0]))
