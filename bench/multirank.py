"""Scaler cost in a real multi-rank job: torch's ShardedGradScaler against ours, side by side.

Real ranks (``torch.multiprocessing``, gloo on 127.0.0.1, one thread each; NCCL with
``--backend nccl`` on a GPU machine, a GPU a rank; ``--device cuda`` with gloo lets the
ranks share one GPU), world sizes 2 and 4, a DDP and an FSDP2 model of a
small MLP. In every rank torch's scaler and ours (telemetry off, and on: rank 0 writes to a
store in a temporary file) train identical model copies in the same group, one after the
other, in rounds of ``--steps`` steps, in an order that turns every round and is reversed
every three (see ``round_order``: no variant keeps a place). Rank 0 times each
round: the whole training step, and the training thread's CPU time in it (``train cpu``:
the step's work without its waits for the other ranks), the scaler's calls alone
(``scale``, ``step``, ``update``: the found_inf all-reduce and its host read are in
``step``), and the training thread's CPU time in those calls (``scaler cpu``: what the
scaler itself costs, without the wait for the other ranks, which is most of a DDP step's
scaler time on gloo and swings with the machine's load). After each round of ours,
untimed, its telemetry is flushed, so that no variant's round runs beside the tail of
another's writes.

The goal is judged on the median of the per-round ratios ours/torch (which cancels the
machine's drift between rounds), with a seeded bootstrap 95% interval in brackets.

    python bench/multirank.py [--worlds 2 4] [--rounds N] [--steps N] [--models ddp fsdp2]
        [--backend gloo|nccl] [--device cpu|cuda] [--norm]

``--norm`` adds two variants of ours, telemetry off: measuring the gradient norm
(``grad_norm=True``), and skipping on spikes as well (``skip_on_spike(grad_norm_z=6,
loss_z=6)``: the decision on the device, the loss in the found_inf all-reduce); with five
variants, rounds are best a multiple of ten (see ``round_order``).

Goal: ours/torch <= 1.00 on every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, median_interval

GOAL = 1.0
VARIANTS = ("torch", "ours, telemetry off", "ours, telemetry on")
NORM_VARIANTS = ("ours, norm on", "ours, norm and skip on")  # --norm; telemetry off
MODELS = ("ddp", "fsdp2")
STEPS = {"ddp": 60, "fsdp2": 30}  # a round's steps: FSDP2's step on cpu is ~5x DDP's
# DDP's rounds are short and its scaler's share of the step small: more of them narrow the
# interval, for the same minutes FSDP2's take. Multiples of six: see round_order.
ROUNDS = {"ddp": 60, "fsdp2": 18}
# "... cpu": the training thread's CPU time in the step, and in the scaler's calls
WORKLOADS = ("train step", "train cpu", "scaler calls", "scaler cpu")
WIDTH = 256
BATCH = 32


def round_order(r: int, variants: tuple[str, ...] = VARIANTS) -> tuple[str, ...]:
    """The variants' order in round ``r``: turned by one place every round, reversed every
    ``len(variants)``. Over twice that many rounds each variant runs as often in each place
    and right after each other one: a place that favours its variant (the middle one,
    between two others, or the one after ours with telemetry on flushed its store) favours
    none.

    >>> [round_order(r).index("torch") for r in range(6)]
    [0, 2, 1, 2, 0, 1]
    """
    turn = r % len(variants)
    order = variants[turn:] + variants[:turn]
    return order if (r // len(variants)) % 2 == 0 else order[::-1]


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 8))


def wrap(kind: str, module: nn.Module, device: str) -> nn.Module:
    module = module.to(device)
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(module)
    from torch.distributed.fsdp import fully_shard

    for layer in module:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(module)


def make_scaler(variant: str, device: str, store_url: str) -> Any:
    if variant == "torch":
        return TorchSharded(device)
    telemetry = store_url if variant == "ours, telemetry on" else False
    norm = variant in NORM_VARIANTS
    gs = scalewatch.ShardedGradScaler(
        device, telemetry=telemetry, run_name="bench-multirank", grad_norm=norm
    )
    if variant == "ours, norm and skip on":
        gs.skip_on_spike(grad_norm_z=6.0, loss_z=6.0)
    return gs


class Case:
    """One variant's model, optimizer and scaler, and its timed steps."""

    def __init__(self, kind: str, variant: str, device: str, store_url: str, rank: int) -> None:
        self.model = wrap(kind, mlp(seed=0), device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.gs = make_scaler(variant, device, store_url)
        self.device = device
        self.rank = rank
        self.batches = [torch.randn(BATCH, WIDTH, device=device) for _ in range(4)]

    def run(self, steps: int) -> tuple[float, float, float, float]:
        """Per step: (seconds, the training thread's CPU seconds, seconds in the scaler's
        calls, the training thread's CPU seconds in them)."""
        gs, opt, model = self.gs, self.opt, self.model
        in_scaler = cpu = 0.0
        clock, thread_clock = time.perf_counter, time.thread_time
        self.sync()
        began, began_cpu = clock(), thread_clock()
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = model(self.batches[i % 4]).float().pow(2).mean()
            t0, c0 = clock(), thread_clock()
            scaled = gs.scale(loss)
            t1, c1 = clock(), thread_clock()
            scaled.backward()
            t2, c2 = clock(), thread_clock()
            gs.step(opt)
            gs.update()
            in_scaler += (t1 - t0) + (clock() - t2)
            cpu += (c1 - c0) + (thread_clock() - c2)
        self.sync()
        step_cpu = thread_clock() - began_cpu
        timed = (clock() - began) / steps, step_cpu / steps, in_scaler / steps, cpu / steps
        if isinstance(gs, scalewatch.ShardedGradScaler):
            # Untimed: what its threads still have to write would otherwise run into the
            # next variant's round (torch's never follows telemetry on: ours off does).
            gs.flush()
        return timed

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def close(self) -> None:
        if isinstance(self.gs, scalewatch.ShardedGradScaler):
            self.gs.close()


def rank_main(
    rank: int, world: int, port: int, backend: str, args: dict[str, Any], out: str
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    # torch's own scaler on FSDP2's DTensor grads: not ours to fix, and not what is timed
    warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1")
    device = args["device"]
    if device == "cuda":  # NCCL: a GPU a rank; gloo: the ranks may share one GPU
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(minutes=5))
    results: dict[str, Any] = {}
    variants = tuple(args["variants"])
    for kind in args["models"]:
        cases = {v: Case(kind, v, device, args["store_url"], rank) for v in variants}
        for case in cases.values():
            case.run(args["warmup"])
        rounds: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in variants}
        threads: dict[str, int] = {}  # scalewatch's threads in the rank (all its scalers)
        for r in range(args["rounds"] or ROUNDS[kind]):
            for variant in round_order(r, variants):
                dist.barrier()
                rounds[variant].append(cases[variant].run(args["steps"] or STEPS[kind]))
                threads[variant] = sum(
                    t.name.startswith("scalewatch") for t in threading.enumerate()
                )
        counts = torch.tensor([threads[v] for v in variants], device=device)
        gathered_counts = [torch.zeros_like(counts) for _ in range(world)]
        _held(dist.all_gather(gathered_counts, counts, async_op=True))
        gathered = [dict(zip(variants, c.tolist(), strict=True)) for c in gathered_counts]
        for case in cases.values():
            case.close()
        del cases
        results[kind] = {"rounds": rounds, "threads": gathered}
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    _held(dist.barrier(async_op=True))
    dist.destroy_process_group()


# The handles of the collectives on tensors of Python's, kept to the end of the process. A
# gloo worker that dropped the last reference to one would free its tensors, which needs
# the GIL, while the training thread, holding it, frees the process group and waits for
# that worker (as scaler/_agreement/ keeps its all-reduces).
_HELD: list[Any] = []


def _held(work: Any) -> None:
    work.wait()
    _HELD.append(work)


def report(world: int, backend: str, results: dict[str, Any]) -> None:
    for kind, data in results.items():
        rounds = data["rounds"]
        threads = data["threads"]
        for index, workload in enumerate(WORKLOADS):
            torch_us = [t[index] * 1e6 for t in rounds["torch"]]
            for variant in list(rounds)[1:]:
                ours_us = [t[index] * 1e6 for t in rounds[variant]]
                ratios = [o / t for o, t in zip(ours_us, torch_us, strict=True)]
                ratio = statistics.median(ratios)
                low, high = median_interval(ratios)
                per_rank = "/".join(str(t[variant]) for t in threads)
                print(
                    f"world={world} {backend} {kind:5s} {workload:12s} {variant:20s}"
                    f" torch {statistics.median(torch_us):8.1f} us"
                    f"  ours {statistics.median(ours_us):8.1f} us"
                    f"  ours/torch x{ratio:.3f} [{low:.3f}, {high:.3f}]"
                    f"  scalewatch threads per rank {per_rank}",
                    flush=True,
                )
                figure(
                    f"multirank world={world} {backend} {kind} {workload}, {variant}",
                    f"ours/torch x{ratio:.3f} [{low:.3f}, {high:.3f}]",
                    f"<= {GOAL:.2f}",
                    ratio <= GOAL,
                    f"torch {statistics.median(torch_us):.0f} us,"
                    f" ours {statistics.median(ours_us):.0f} us",
                )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, help="rounds (default: ddp 60, fsdp2 18)")
    parser.add_argument("--steps", type=int, help="steps a round (default: ddp 60, fsdp2 30)")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--norm", action="store_true", help="add ours with the gradient norm, and the skip"
    )
    ns = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        for world in ns.worlds:
            out = str(Path(tmp) / f"world{world}.json")
            args = {
                "rounds": ns.rounds,
                "steps": ns.steps,
                "warmup": ns.warmup,
                "models": ns.models,
                "variants": [*VARIANTS, *(NORM_VARIANTS if ns.norm else ())],
                "device": "cuda" if ns.backend == "nccl" else ns.device,
                "store_url": f"sqlite:///{Path(tmp) / f'store{world}.db'}",
            }
            mp.spawn(rank_main, args=(world, free_port(), ns.backend, args, out), nprocs=world)
            report(world, ns.backend, json.loads(Path(out).read_text()))


if __name__ == "__main__":
    main()
