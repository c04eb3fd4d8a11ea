"""Real gloo ranks on 127.0.0.1: torch's ShardedGradScaler and ours side by side in every rank.

One spawn per world size runs every scenario (DDP, FSDP2 with an fp16
MixedPrecisionPolicy, FSDP1; FSDP1 with CPUOffload, which torch refuses without an
accelerator): in each rank torch's scaler and ours train
identical model copies in the same WORLD group, one after the other, with an
inf/NaN injected into one chosen rank's local gradients at chosen steps.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch
from tests._helpers.nets import FSDP2_HERE, skip_unless_fsdp2_here, wrap
from tests._helpers.ranks import run_ranks
from tests._helpers.twin import world1
from tests.scaler._kept_samples import keep_samples

STEPS = 8
WIDTH = 16


class Recorded(scalewatch.ShardedGradScaler):
    """Ours, keeping the per-step samples the recorder hands to telemetry (testing only)."""

    def _reset_transient(self) -> None:
        super()._reset_transient()
        self.samples = keep_samples(self)


def model_copy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4))


def local(t: torch.Tensor) -> torch.Tensor:
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


def train(
    kind: str, gs: Any, rank: int, plan: dict[int, tuple[int, float]], device: str = "cpu"
) -> dict[str, Any]:
    """plan: step -> (the rank whose local gradient gets ``value``, value)."""
    model = wrap(kind, model_copy(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out: dict[str, Any] = {"scales": [], "trackers": [], "skipped": []}
    for step in range(STEPS):
        opt.zero_grad()
        g = torch.Generator().manual_seed(100 * step + rank)
        loss = model(torch.randn(6, 4, generator=g).to(device)).float().pow(2).mean()
        gs.scale(loss).backward()
        first = next(p for p in model.parameters() if local(p.grad).numel() > 0)
        bad_rank, value = plan.get(step, (-1, 0.0))
        if rank == bad_rank:
            with torch.no_grad():
                local(first.grad).view(-1)[0] = value
        before = [local(p).detach().clone() for p in model.parameters()]
        gs.step(opt)
        gs.update()
        out["scales"].append(gs.get_scale())
        out["trackers"].append(gs._get_growth_tracker())
        after = [local(p).detach() for p in model.parameters()]
        out["skipped"].append(all(torch.equal(b, a) for b, a in zip(before, after, strict=True)))
    # plain lists: tensors would cross the result queue as shared memory owned by a dying rank
    out["params"] = [local(p).detach().tolist() for p in model.parameters()]
    grad = local(next(iter(model.parameters())).grad)
    out["grad_dtype"], out["grad_device"] = str(grad.dtype), grad.device.type
    return out


def plan_for(world: int) -> dict[int, tuple[int, float]]:
    last = world - 1
    return {1: (last, float("inf")), 2: (1, float("nan")), 5: (0, float("-inf"))}


FACTORS = {"init_scale": 1024.0, "growth_factor": 1.7, "backoff_factor": 0.3}


def error_of(fn: Any) -> str | None:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def worker(rank: int, world: int, kinds: list[str], device: str = "cpu") -> dict[str, Any]:
    results: dict[str, Any] = {}
    plan = plan_for(world)
    for kind in kinds:
        ours = Recorded(device, growth_interval=2, telemetry=False, **FACTORS)
        try:
            theirs = TorchSharded(device, growth_interval=2, **FACTORS)
            reference = train(kind, theirs, rank, plan, device)
        except Exception as exc:  # torch refuses the setup: ours must refuse it the same way
            dist.barrier()
            results[kind] = {
                "unsupported": f"{type(exc).__name__}: {exc}",
                "ours_error": error_of(functools.partial(train, kind, ours, rank, plan, device)),
            }
            dist.barrier()
            continue
        mine = train(kind, ours, rank, plan, device)
        stats = ours.stats()
        samples = [sample.record for sample in ours.samples]
        results[kind] = {
            "torch": reference,
            "ours": mine,
            "stats": stats,
            "inf_ranks": [s.inf_ranks for s in samples],
            "overflow": [s.overflow for s in samples],
        }
        dist.barrier()
    return results


KINDS = ["ddp", *(["fsdp2"] if FSDP2_HERE else []), "fsdp1", "fsdp1-offload"]


def check(world: int, per_rank: list[dict[str, Any]]) -> None:
    for kind in KINDS[:-1]:
        check_kind(kind, world, per_rank)
    # torch's FSDP1 offloads parameters only to feed an accelerator: on cpu ranks it refuses
    # (the cpu build: no accelerator; with a GPU present: a cpu device_id has no streams to sync)
    # and ours refuses it with the same error (FSDP1's own). One GPU per rank: see the cuda test.
    offload = [r["fsdp1-offload"] for r in per_rank]
    assert all(r.get("ours_error") == r.get("unsupported") is not None for r in offload), offload
    # torch's words vary with its release and build (2.13's cpu build: "Cannot access
    # accelerator device when none is available."): one refusal, the same on every rank.
    assert len({r["unsupported"] for r in offload}) == 1
    if FSDP2_HERE:
        fsdp2 = per_rank[0]["fsdp2"]["ours"]
        assert fsdp2["grad_dtype"] == "torch.float32"  # fp16 compute, fp32 sharded grads


def check_kind(kind: str, world: int, per_rank: list[dict[str, Any]]) -> None:
    plan = plan_for(world)
    expected_ranks = [(plan[s][0],) if s in plan else () for s in range(STEPS)]
    unsupported = {r[kind].get("unsupported") for r in per_rank}
    assert unsupported == {None}, (kind, unsupported)
    for rank, result in enumerate(per_rank):
        theirs, mine = result[kind]["torch"], result[kind]["ours"]
        assert mine["scales"] == theirs["scales"], (kind, rank)
        assert mine["trackers"] == theirs["trackers"], (kind, rank)
        # the inf on one rank skips the step on every rank
        assert theirs["skipped"] == [s in plan for s in range(STEPS)], (kind, rank)
        assert mine["skipped"] == theirs["skipped"], (kind, rank)
        assert mine["params"] == theirs["params"], (kind, rank)  # exact float equality
        assert result[kind]["overflow"] == [s in plan for s in range(STEPS)]
        # every rank learns from the one all-reduce which rank it was
        assert result[kind]["inf_ranks"] == expected_ranks, (kind, rank)
        stats = result[kind]["stats"]
        assert (stats.steps, stats.overflows, stats.skipped) == (STEPS, 3, 3)
        assert stats.current_scale == theirs["scales"][-1]
    # all ranks agree
    assert len({tuple(r[kind]["ours"]["scales"]) for r in per_rank}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_torch_and_ours_side_by_side_on_real_ranks(world: int) -> None:
    check(world, run_ranks(worker, world, KINDS, timeout=150.0))


@pytest.mark.cuda
@pytest.mark.slow
def test_ddp_on_cuda_side_by_side_on_real_ranks() -> None:
    """Both ranks on the one GPU; the found_inf payload is a cuda tensor all-reduced by gloo."""
    check_kind("ddp", 2, run_ranks(worker, 2, ["ddp"], "cuda", timeout=150.0))


@pytest.mark.cuda
@pytest.mark.parametrize("reduce", [False, True], ids=["one-rank", "all-reduce-kept"])
@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")
def test_fsdp1_cpu_offload_on_one_gpu(reduce: bool) -> None:
    """FSDP1 with CPUOffload as it runs: compute on the GPU, shards and their grads on cpu,
    the scale on cuda; one NCCL rank. ``all-reduce-kept`` runs ours with the found_inf
    all-reduce a one-rank group skips, over NCCL, as a multi-GPU job does."""
    plan = {1: (0, float("inf")), 2: (0, float("nan")), 5: (0, float("-inf"))}
    torch.cuda.set_device(0)
    with world1("nccl"):
        reference = TorchSharded("cuda", growth_interval=2, **FACTORS)
        theirs = train("fsdp1-offload", reference, 0, plan, "cuda")
        ours = Recorded("cuda", growth_interval=2, telemetry=False, **FACTORS)
        ours._reduce_alone = reduce
        mine = train("fsdp1-offload", ours, 0, plan, "cuda")
    assert theirs["grad_device"] == mine["grad_device"] == "cpu"
    assert theirs["skipped"] == [s in plan for s in range(STEPS)]
    for key in ("scales", "trackers", "skipped", "params"):
        assert mine[key] == theirs[key], key
    assert [s.record.overflow for s in ours.samples] == theirs["skipped"]
    expected_ranks = [(0,) if s in plan else () for s in range(STEPS)]
    assert [s.record.inf_ranks for s in ours.samples] == expected_ranks


def _threads_after_steps(
    rank: int, world: int, url: str, mirror: str | None
) -> tuple[list[str], int]:
    """The scalewatch threads of this rank after 5 steps, and how many processes it started;
    ``mirror``: its ``$SCALEWATCH_MIRROR``, the same on every rank."""
    import os
    import threading

    if mirror is not None:
        os.environ["SCALEWATCH_MIRROR"] = mirror

    model = nn.parallel.DistributedDataParallel(model_copy())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gs = scalewatch.ShardedGradScaler("cpu", telemetry=url, run_name="threads")
    for step in range(5):
        opt.zero_grad()
        g = torch.Generator().manual_seed(step + rank)
        gs.scale(model(torch.randn(6, 4, generator=g)).pow(2).mean()).backward()
        gs.step(opt)
        gs.update()
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith("scalewatch"))
    children = sum(
        len(Path(task, "children").read_text().split())
        for task in Path("/proc/self/task").iterdir()
    )
    assert gs.stats().steps == 5  # a rank without a thread still counts its steps
    gs.close()
    return names, children


@pytest.mark.slow
def test_only_the_reporting_rank_runs_threads(tmp_path: Any) -> None:
    """A rank that writes nothing needs no thread and no writer process: 2-4 ranks share
    a few cores. The reporting rank's store writes and control polls run in its writer
    process; in the rank itself (on cpu, where the training thread hands each step's row
    over and no recorder thread is needed) the writer process's sender and receiver."""
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    # A mirror named for every rank (scalewatch instrument's way) writes on the reporting
    # rank alone, from a thread of its own.
    tensorboard = importlib.util.find_spec("tensorboard") is not None
    mirror = f"tensorboard:{tmp_path / 'tb'}" if tensorboard else None
    reporting, other = run_ranks(_threads_after_steps, 2, url, mirror, timeout=120.0)
    mirrors = ["scalewatch-mirror-tensorboard"] if tensorboard else []
    assert reporting == ([*mirrors, "scalewatch-receiver", "scalewatch-sender"], 1)
    assert other == ([], 0)
    if tensorboard:
        assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1


def worker_float64(rank: int, world: int, kinds: list[str]) -> dict[str, Any]:
    """``worker`` with the payload a float64 copy of found_inf, as past 23 ranks, on
    several devices and on cuda (on cpu, up to 23 ranks, found_inf is agreed in place)."""
    from scalewatch._agreement import payload as _payload

    _payload.IN_PLACE_RANKS = 0
    return worker(rank, world, kinds)


@pytest.mark.slow
def test_the_float64_payload_agrees_as_the_in_place_one() -> None:
    world = 2
    kinds = ["ddp", "fsdp2"] if FSDP2_HERE else ["ddp"]
    per_rank = run_ranks(worker_float64, world, kinds, timeout=150.0)
    for kind in kinds:
        check_kind(kind, world, per_rank)


def test_fsdp2_is_compared_on_real_ranks() -> None:
    """The tests above leave FSDP2 out where torch's does not run on these ranks: a skip
    says so here."""
    skip_unless_fsdp2_here()
    assert "fsdp2" in KINDS
