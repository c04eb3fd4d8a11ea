"""The collectives a ShardedGradScaler issues per step, counted on real gloo ranks.

Each rank counts at two levels, with the step and whether the scaler, the model or
neither was running: every collective function of ``torch.distributed`` and of its
functional collectives, wrapped (in the module that defines it too, so a collective made
of others, as ``gather_object``, counts each one on the wire), from any thread; and every
``c10d`` op that reaches torch's dispatcher on the training thread, however it was issued
(a ``ProcessGroup`` method, C++: DDP's reducer). One spawn of two ranks trains a DDP model
and an FSDP2 one with torch's ShardedGradScaler and with ours, watched and not; inf goes
into one named parameter's gradient on rank 1, or on both ranks, at chosen steps.

Found: torch's scaler issues one all-reduce of found_inf per optimizer and step (one
device here, so one flag), overflow or not; on FSDP2 another before it, which DTensor
issues inside the unscale kernel (found_inf of sharded gradients, a functional
all-reduce). Ours checks local shards, and folds every rank's own flag and the
control-request flag into its one all-reduce: a clean step issues exactly that one,
watched or not, on either model. An overflow step adds exactly one ``gather`` (every
rank's findings to rank 0, see ``scalewatch._diagnosis.gather``),
however many optimizers overflowed.
Diagnosis runs without ``watch`` too (positional names), so an unwatched scaler gathers
as well. A fused optimizer's found_inf is agreed by the same all-reduce (torch's is not),
so the DDP replicas stay equal. With ``grad_norm=True`` the squares of the gradient
shards ride in that same all-reduce: still exactly one a clean step; so do, with
``skip_on_spike(loss_z=...)``, the ranks' losses (the spike decision itself is taken on
each rank from the agreed numbers: no collective of its own). (A step that
carries a control request adds a broadcast, see ``test_control.py``; none is made here.)
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed import distributed_c10d
from torch.utils._python_dispatch import TorchDispatchMode

import scalewatch
from tests._helpers.nets import FSDP2_HERE, Net, fully_shard_net
from tests._helpers.ranks import run_ranks

STEPS = 6
# step -> the ranks whose encoder.weight gradient gets an inf after backward
OVERFLOWS = {1: (1,), 3: (0, 1), 4: (1,)}
# name -> (model, scaler, watched, optimizers, fused)
KINDS: dict[str, tuple[str, str, bool, int, bool]] = {
    "torch": ("ddp", "torch", False, 1, False),
    "unwatched": ("ddp", "ours", False, 1, False),
    "watched": ("ddp", "ours", True, 1, False),
    "two-optimizers": ("ddp", "ours", True, 2, False),
    "fused": ("ddp", "ours", True, 1, True),
}
KINDS["norm"] = ("ddp", "ours", True, 1, False)
KINDS["skip"] = ("ddp", "ours", True, 1, False)
KINDS["fused-skip"] = ("ddp", "ours", True, 1, True)
KINDS["two-optimizers-skip"] = ("ddp", "ours", True, 2, False)
if FSDP2_HERE:
    KINDS["fsdp2-torch"] = ("fsdp2", "torch", False, 1, False)
    KINDS["fsdp2-watched"] = ("fsdp2", "ours", True, 1, False)
    KINDS["fsdp2-norm"] = ("fsdp2", "ours", True, 1, False)
    KINDS["fsdp2-skip"] = ("fsdp2", "ours", True, 1, False)
SKIP = ("skip", "fused-skip", "two-optimizers-skip", "fsdp2-skip")  # ours skipping spikes
NORM = ("norm", "fsdp2-norm", *SKIP)  # ours measuring the gradient norm
COLLECTIVES = (
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
)
FUNCTIONAL = (
    "all_gather_into_tensor_coalesced",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "broadcast",
    "permute_tensor",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_tensor_coalesced",
)
Call = tuple[str, int, str, str]  # kind, step, where ("scaler", "model", ...), collective


class Counter:
    """Records a :data:`Call` for every collective function called, on any thread."""

    def __init__(self) -> None:
        self.at: tuple[str, int, str] = ("", -1, "setup")
        self.calls: list[Call] = []

    def install(self) -> None:
        for module, names, prefix in (
            (distributed_c10d, COLLECTIVES, ""),
            (funcol, FUNCTIONAL, "functional."),
        ):
            for name in names:
                self._wrap(module, name, prefix + name)

    def _wrap(self, module: ModuleType, name: str, label: str) -> None:
        original = getattr(module, name, None)
        if original is None:
            return
        counted = self._counted(label, original)
        setattr(module, name, counted)
        if module is distributed_c10d and getattr(dist, name, None) is original:
            setattr(dist, name, counted)

    def _counted(self, label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((*self.at, label))
            return original(*args, **kwargs)

        return counted


class Dispatched(TorchDispatchMode):
    """Records a :data:`Call` for every communication op the dispatcher runs on this thread
    (but those a tensor subclass issues while it handles another op: DTensor's)."""

    def __init__(self, counter: Counter) -> None:
        super().__init__()
        self.counter = counter
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace in ("c10d", "_c10d_functional") and "wait" not in str(func):
            self.calls.append((*self.counter.at, str(func)))
        return func(*args, **(kwargs or {}))


def wrap(model: str) -> nn.Module:
    net = Net()
    if model == "ddp":
        return nn.parallel.DistributedDataParallel(net)
    return fully_shard_net(net)


def encoder_grad(model: nn.Module) -> torch.Tensor:
    for name, param in model.named_parameters():
        if name.removeprefix("module.") == "encoder.weight":
            assert param.grad is not None
            return getattr(param.grad, "_local_tensor", param.grad)
    raise AssertionError("no encoder.weight")


def make_scaler(which: str, url: str, kind: str) -> Any:
    if which == "torch":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler("cpu", init_scale=1024.0)
    gs = scalewatch.ShardedGradScaler(
        "cpu", init_scale=1024.0, telemetry=url, run_name=kind, grad_norm=kind in NORM
    )
    if kind in SKIP:
        gs.skip_on_spike(grad_norm_z=6.0, loss_z=6.0)
    return gs


def train(rank: int, kind: str, url: str, counter: Counter) -> list[list[float]]:
    """Trains ``kind``; returns this rank's parameters (its shards under FSDP2), flat."""
    model_kind, which, watched, count, fused = KINDS[kind]
    counter.at = (kind, -1, "setup")
    model = wrap(model_kind)
    gs = make_scaler(which, url, kind)
    if watched:
        gs.watch(model)
    params = list(model.parameters())
    groups = [params] if count == 1 else [params[:2], params[2:]]
    opts = [torch.optim.SGD(group, lr=0.01, fused=fused) for group in groups]
    for step in range(STEPS):
        counter.at = (kind, step, "model")
        for opt in opts:
            opt.zero_grad()
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 * step + rank))
        loss = model(x).pow(2).mean()
        counter.at = (kind, step, "scaler")
        scaled = gs.scale(loss)
        counter.at = (kind, step, "model")
        scaled.backward()
        if rank in OVERFLOWS.get(step, ()):
            with torch.no_grad():
                encoder_grad(model)[0, 0] = float("inf")
        counter.at = (kind, step, "scaler")
        for opt in opts:
            gs.step(opt)
        gs.update()
    counter.at = (kind, STEPS, "close")
    if which == "ours":
        assert gs.stats().overflows == len(OVERFLOWS)
        assert (gs.last_grad_norm is not None) == (kind in NORM)
        gs.close()
    # as lists: a tensor would reach the test through shared memory the rank takes with it
    return [getattr(p, "_local_tensor", p).detach().view(-1).tolist() for p in model.parameters()]


def worker(
    rank: int, world: int, url: str
) -> tuple[list[Call], list[Call], dict[str, list[list[float]]]]:
    """(the functions' calls, the dispatched ops) of every kind, in the order issued, and
    each kind's parameters at the end."""
    # torch's scaler on DTensor gradients: DTensor warns of its one-element found_inf
    warnings.filterwarnings("ignore", "Found a non-scalar tensor with numel=1", UserWarning)
    counter = Counter()
    counter.install()
    with Dispatched(counter) as dispatched:
        params = {kind: train(rank, kind, url, counter) for kind in KINDS}
    return counter.calls, dispatched.calls, params


def by_step(calls: list[Call], kind: str) -> dict[int, list[str]]:
    """The collectives ``kind``'s scaler issued, by step."""
    out: dict[int, list[str]] = {step: [] for step in range(STEPS)}
    for k, step, where, name in calls:
        if k == kind and where == "scaler":
            out[step].append(name)
    return out


def elsewhere(calls: list[Call], kind: str) -> list[tuple[int, str, str]]:
    """The collectives issued while ``kind``'s scaler was not running."""
    return [
        (step, where, name) for k, step, where, name in calls if k == kind and where != "scaler"
    ]


@pytest.mark.slow
def test_an_overflow_step_costs_one_gather_and_a_clean_step_none(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    per_rank = run_ranks(worker, 2, url, timeout=180.0)
    for kind, (model, *_) in KINDS.items():
        if model == "ddp":  # every rank skipped the overflow steps: the replicas agree
            assert per_rank[0][2][kind] == per_rank[1][2][kind], kind
            # and no rank stepped with its inf (a fused optimizer skips at found_inf 1 only)
            flat = [x for param in per_rank[1][2][kind] for x in param]
            assert all(math.isfinite(x) for x in flat), kind
    for rank, (called, dispatched, _) in enumerate(per_rank):
        for kind, (model, which, _, count, _) in KINDS.items():
            # A clean step, torch's scaler or ours, watched or not: one all-reduce of found_inf
            # per optimizer (one device here); under torch's on FSDP2, DTensor's own before it.
            hidden = ["functional.all_reduce"] if (model, which) == ("fsdp2", "torch") else []
            reduce = [*hidden, "all_reduce"] * count
            reduce_op = ["c10d.allreduce_.default"] * count
            gather, gather_op = ["gather"], ["c10d.gather_.default"]
            for calls, clean, extra in (
                (called, reduce, gather),
                (dispatched, reduce_op, gather_op),
            ):
                # an overflow step: ours adds the one gather of every rank's findings
                want = {
                    step: clean + (extra if step in OVERFLOWS and which == "ours" else [])
                    for step in range(STEPS)
                }
                assert by_step(calls, kind) == want, (rank, kind)
                # Nothing from the scaler while the model runs (FSDP2's all-gathers and
                # reduce-scatters, DDP's all-reduces), at setup or at close: all as with torch's.
                twin = "torch" if model == "ddp" else "fsdp2-torch"
                assert elsewhere(calls, kind) == elsewhere(calls, twin), (rank, kind)
