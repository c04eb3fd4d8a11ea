"""Ours reads device values on the training thread no more often than torch's scalers do.

On a clean step ours reads no more than torch's; on an overflow step the diagnosis adds
at most ``DIAGNOSIS_READS``: which gradients (and the loss) hold inf/NaN, then their
counts. On cpu the calls that bring a tensor's value to the host are counted (only on
the training thread), but for the telemetry capture of a cpu step
(``scalewatch._recording.step_values.read_cpu``, ``read_if_clean`` and ``read_top``): a cpu
tensor is memory, and reading it there is no sync; on cuda that capture is an asynchronous copy to
pinned memory instead. On cuda torch's sync debug mode reports the synchronisations
themselves.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch
from scalewatch._recording.step_values import read_cpu, read_if_clean, read_top
from tests._helpers.twin import (
    INJECT,
    batch,
    mlp,
    poison,
    skip_unless_torchs_sharded_steps_fused_overflows,
    world1,
)
from tests.scaler._kept_samples import keep_samples

HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")
STEPS = 10
# a cpu step's capture: no sync
CAPTURES = (read_cpu.__code__, read_if_clean.__code__, read_top.__code__)
DIAGNOSIS_READS = 2  # per overflow step: one device, one gradient dtype


@contextlib.contextmanager
def counting_host_reads() -> Iterator[Counter[str]]:
    """Count the host reads made on this thread; the originals are restored afterwards."""
    counts: Counter[str] = Counter()
    main = threading.get_ident()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            capture = sys._getframe(1).f_code in CAPTURES
            if threading.get_ident() == main and not capture:
                counts[name] += 1
            return original(*args, **kwargs)

        return wrapper

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(name, original))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    assert all(getattr(torch.Tensor, n) is originals[n] for n in HOST_READS)


def sgd(model: nn.Module) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD(model.parameters(), lr=0.05)]


def fused_adam(model: nn.Module) -> list[torch.optim.Optimizer]:
    return [torch.optim.Adam(model.parameters(), lr=0.01, fused=True)]


def two(model: nn.Module) -> list[torch.optim.Optimizer]:
    first, _, last = model  # type: ignore[misc]
    return [
        torch.optim.SGD(first.parameters(), lr=0.05),
        torch.optim.Adam(last.parameters(), lr=0.01),
    ]


OPTIMIZERS = {"sgd": sgd, "fused-adam": fused_adam, "two-optimizers": two}


def steps(
    gs: Any, optimizers: Callable[[nn.Module], list[torch.optim.Optimizer]]
) -> tuple[Counter[str], Counter[str]]:
    """Train ``STEPS`` steps with some infs; the host reads of the scaler calls alone, on
    the clean steps and on the overflow steps."""
    model = mlp()
    opts = optimizers(model)
    params = list(model.parameters())
    clean: Counter[str] = Counter()
    overflow: Counter[str] = Counter()
    for step in range(STEPS):
        total = overflow if step in INJECT else clean
        for opt in opts:
            opt.zero_grad()
        loss = model(batch(step)).pow(2).mean()
        with counting_host_reads() as counts:
            scaled = gs.scale(loss)
        total += counts
        scaled.backward()
        for index, value in INJECT.get(step, []):
            poison(params, index, value)
        with counting_host_reads() as counts:
            for opt in opts:
                gs.step(opt)
            gs.update()
        total += counts
    return clean, overflow


def compare(reference: Any, ours: Any, optimizers: str) -> tuple[int, int]:
    theirs, theirs_overflow = steps(reference, OPTIMIZERS[optimizers])
    mine, mine_overflow = steps(ours, OPTIMIZERS[optimizers])
    assert sum(mine.values()) <= sum(theirs.values()), (mine, theirs)
    for name in HOST_READS:
        assert mine[name] <= theirs[name] or name in ("item", "tolist"), (name, mine, theirs)
    added = sum(mine_overflow.values()) - sum(theirs_overflow.values())
    assert added <= DIAGNOSIS_READS * len(INJECT), (mine_overflow, theirs_overflow)
    print(f"{optimizers}: torch {dict(theirs)} ours {dict(mine)}, overflow steps +{added}")
    theirs += theirs_overflow
    mine += mine_overflow
    return sum(theirs.values()), sum(mine.values())


# Ours measuring nothing more, the gradient norm, or the norm and the skip on spikes (whose
# decision is read with found_inf, in the one read step() makes), also resumed with full
# windows from a state dict (laid on the device at the first step: nothing read back).
MODES = ("norm-off", "norm-on", "skip-on", "skip-resumed")


def ours(cls: Any, mode: str, *args: Any, **kwargs: Any) -> Any:
    gs = cls(*args, grad_norm=mode != "norm-off", **kwargs)
    if mode.startswith("skip"):
        gs.skip_on_spike(grad_norm_z=6.0, loss_z=6.0)
    if mode == "skip-resumed":
        state = gs.state_dict()
        g = torch.Generator().manual_seed(0)
        windows = {name: torch.rand(200, generator=g) + 1.0 for name in ("grad_norm", "loss")}
        state["scalewatch"]["spike_windows"] = windows
        gs.load_state_dict(state)
    return gs


def test_counter_sees_reads_on_this_thread_only() -> None:
    t = torch.ones(2)
    with counting_host_reads() as counts:
        t.sum().item()
        t.tolist()
        bool(t[0])
        worker = threading.Thread(target=lambda: t.sum().item())
        worker.start()
        worker.join(timeout=10)
    assert counts == Counter({"item": 1, "tolist": 1, "__bool__": 1})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizers", list(OPTIMIZERS))
def test_grad_scaler(optimizers: str, mode: str) -> None:
    # grad_norm: the norm stays a device value, read by the capture alone; the skip's
    # decision is read with found_inf, in the read torch's step makes (none when fused)
    kwargs: dict[str, Any] = {"init_scale": 256.0, "growth_interval": 3}
    theirs, _ = compare(
        torch.amp.GradScaler("cpu", **kwargs),
        ours(scalewatch.GradScaler, mode, "cpu", telemetry=False, **kwargs),
        optimizers,
    )
    # fused optimizers skip on device: neither scaler reads anything then
    assert (theirs > 0) != (optimizers == "fused-adam")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizers", list(OPTIMIZERS))
def test_sharded_in_a_world_of_one(optimizers: str, mode: str) -> None:
    if optimizers == "fused-adam":
        skip_unless_torchs_sharded_steps_fused_overflows()
    kwargs: dict[str, Any] = {"device": "cpu", "init_scale": 256.0, "growth_interval": 3}
    with world1():  # grad_norm: the shards' squares ride in the payload, read with it
        theirs, mine = compare(
            TorchSharded(**kwargs),
            ours(scalewatch.ShardedGradScaler, mode, telemetry=False, **kwargs),
            optimizers,
        )
    # ours reads the whole payload once per step instead of every found_inf
    assert mine < theirs + DIAGNOSIS_READS * len(INJECT) or optimizers == "fused-adam"


@pytest.mark.parametrize("optimizers", list(OPTIMIZERS))
def test_sharded_without_process_group(optimizers: str, no_group: None) -> None:
    if optimizers == "fused-adam":
        skip_unless_torchs_sharded_steps_fused_overflows()
    kwargs: dict[str, Any] = {"device": "cpu", "init_scale": 256.0, "growth_interval": 3}
    ours, ours_overflow = steps(
        scalewatch.ShardedGradScaler(telemetry=False, **kwargs), OPTIMIZERS[optimizers]
    )
    with world1():
        theirs, theirs_overflow = steps(TorchSharded(**kwargs), OPTIMIZERS[optimizers])
    assert sum(ours.values()) <= sum(theirs.values()), (ours, theirs)
    added = sum(ours_overflow.values()) - sum(theirs_overflow.values())
    assert added <= DIAGNOSIS_READS * len(INJECT), (ours_overflow, theirs_overflow)


# ------------------------------------------------------------------------ cuda


def cuda_steps(gs: Any, optimizers: str, *, error_mode_for_step: bool) -> int:
    """Synchronisations reported by torch's sync debug mode over the steps."""
    torch.manual_seed(0)
    model = mlp().cuda()
    opts = OPTIMIZERS[optimizers](model)
    params = list(model.parameters())
    syncs = 0
    for step in range(STEPS):
        for opt in opts:
            opt.zero_grad()
        x = batch(step).cuda()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("error")
            try:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(x).float().pow(2).mean()
                gs.scale(loss).backward()
                for index, value in INJECT.get(step, []):
                    poison(params, index, value)
                if not error_mode_for_step:
                    torch.cuda.set_sync_debug_mode("warn")
                for opt in opts:
                    gs.step(opt)
                torch.cuda.set_sync_debug_mode("error")
                gs.update()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs += sum("synchroniz" in str(w.message) for w in caught)
    torch.cuda.synchronize()
    return syncs


@pytest.mark.cuda
@pytest.mark.parametrize("optimizers", list(OPTIMIZERS))
@pytest.mark.parametrize(
    ("telemetry", "mode"),
    [(False, "norm-off"), (None, "norm-off"), (None, "norm-on"), (None, "skip-on")],
    ids=["telemetry-off", "telemetry-on", "telemetry-and-norm-on", "telemetry-and-skip-on"],
)
def test_cuda_sync_debug_mode(optimizers: str, telemetry: bool | None, mode: str) -> None:
    # scale, backward and update never sync; torch's step reads found_inf unless fused.
    # telemetry=None: the default store (a private file for each test).
    fused = optimizers == "fused-adam"
    kwargs: dict[str, Any] = {"init_scale": 256.0, "growth_interval": 3}
    reference = torch.amp.GradScaler("cuda", **kwargs)
    theirs = cuda_steps(reference, optimizers, error_mode_for_step=fused)
    plain = ours(scalewatch.GradScaler, mode, "cuda", telemetry=telemetry, **kwargs)
    mine = cuda_steps(plain, optimizers, error_mode_for_step=fused)
    # an overflow step is explained in step(), after torch's own read: update() never syncs
    diagnosis = 0 if fused else DIAGNOSIS_READS * len(INJECT)
    assert mine <= theirs + diagnosis
    assert (plain._session.telemetry is not None) == (telemetry is None)
    plain.close()
    with world1():
        theirs = cuda_steps(TorchSharded("cuda", **kwargs), optimizers, error_mode_for_step=False)
        sharded = ours(scalewatch.ShardedGradScaler, mode, "cuda", telemetry=telemetry, **kwargs)
        mine = cuda_steps(sharded, optimizers, error_mode_for_step=False)
        assert (sharded._session.telemetry is not None) == (telemetry is None)
        assert sharded.stats().steps == STEPS
        assert (sharded.last_grad_norm is not None) == (mode != "norm-off")
        sharded.close()
    assert mine <= theirs + diagnosis


class _Recorded:
    """A sink that keeps the records, as telemetry would receive them."""

    def _reset_transient(self) -> None:
        super()._reset_transient()  # type: ignore[misc]
        self.samples = keep_samples(self)

    @property
    def records(self) -> list[Any]:
        return [sample.record for sample in self.samples]


class RecordedPlain(_Recorded, scalewatch.GradScaler):
    pass


class RecordedSharded(_Recorded, scalewatch.ShardedGradScaler):
    pass


@pytest.mark.parametrize("optimizers", ["sgd", "fused-adam"])
def test_the_loss_reaches_the_record_without_a_read(optimizers: str) -> None:
    """Every record carries the loss ``scale()`` saw and the gradient norm measured; their
    capture reads nothing more (the recorder's sink is on, as on a reporting rank)."""
    if optimizers == "fused-adam":
        skip_unless_torchs_sharded_steps_fused_overflows()
    kwargs: dict[str, Any] = {"init_scale": 256.0, "growth_interval": 3}
    clean, _ = steps(torch.amp.GradScaler("cpu", **kwargs), OPTIMIZERS[optimizers])
    kwargs["grad_norm"] = True
    plain = RecordedPlain("cpu", **kwargs)
    mine, _ = steps(plain, OPTIMIZERS[optimizers])
    assert sum(mine.values()) <= sum(clean.values()), (mine, clean)
    without_norm = {k: v for k, v in kwargs.items() if k != "grad_norm"}
    with world1():
        clean, _ = steps(TorchSharded("cpu", **without_norm), OPTIMIZERS[optimizers])
        sharded = RecordedSharded("cpu", **kwargs)
        mine, _ = steps(sharded, OPTIMIZERS[optimizers])
        assert sum(mine.values()) <= sum(clean.values()), (mine, clean)
        assert sharded.flush()
    assert plain.flush()
    for gs in (plain, sharded):
        losses = [record.loss for record in gs.records]
        assert len(losses) == STEPS and all(isinstance(loss, float) for loss in losses)
        model = mlp()
        assert losses[0] == model(batch(0)).pow(2).mean().item()  # the first step's, exactly
        norms = [record.grad_norm for record in gs.records]
        assert all(isinstance(norm, float) for norm in norms)
        assert [not math.isfinite(norm) for norm in norms] == [s in INJECT for s in range(STEPS)]
        gs.close()
