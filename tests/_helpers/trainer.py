"""A small real training job for the browser tests and screenshots.

Each rank (gloo on CPU, rank 0 is this process, the others are started by it) trains a
small MLP sharded with FSDP2 in fp16 mixed precision, with ``scaler.ShardedGradScaler``
writing telemetry to ``--db``. Between backward and step, chosen ranks write an inf or a
NaN into one of their real gradient shards at chosen steps, so the run has overflows
attributed to ranks (besides those fp16 makes itself once the scale is high). Runtime
control requests go through the scaler's own poller and all-reduce payload. Rank 0
prints ``{"run_id": N}`` once the run exists; the job stops after ``--steps`` (0: never)
or on SIGTERM/SIGINT, all ranks at the same step, and closes the scaler so the run ends
as finished. ``--crash-at`` kills rank 0 instead.

    python tests/_helpers/trainer.py --db sqlite:///x.db --port 29500 --name demo --burst 200
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

# torch is imported after the other ranks are started, so that they import it meanwhile.
if TYPE_CHECKING:
    from torch import nn

    from scalewatch import ShardedGradScaler

IN, HIDDEN = 16, 64
RUN_ID_TIMEOUT_S = 120.0
STOP_CHECK_EVERY = 5  # steps


def parse_ranks(text: str) -> frozenset[int]:
    return frozenset(int(rank) for rank in text.split(",") if rank.strip())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", required=True, help="store URL")
    parser.add_argument("--name", default="test run", help="run name (any text)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many; 0: never")
    parser.add_argument("--rate", type=float, default=20.0, help="steps/s after the burst; 0: max")
    parser.add_argument("--burst", type=int, default=0, help="first steps trained unpaced")
    parser.add_argument("--init-scale", type=float, default=2.0**16)
    parser.add_argument("--growth-interval", type=int, default=20)
    parser.add_argument("--inject-every", type=int, default=25, help="0: never")
    parser.add_argument("--inject-ranks", type=parse_ranks, default=frozenset({1}))
    parser.add_argument(
        "--all-ranks-every", type=int, default=100, help="inject on every rank; 0: never"
    )
    parser.add_argument("--crash-at", type=int, default=0, help="SIGKILL rank 0 at this step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, required=True, help="the gloo store's, on 127.0.0.1")
    args = parser.parse_args(argv)
    if args.world_size < 1 or args.steps < 0 or args.rate < 0:
        parser.error("--world-size must be >= 1, --steps and --rate >= 0")
    return args


def bad_value(step: int, rank: int, args: argparse.Namespace) -> float | None:
    """The non-finite value this rank writes into a gradient at ``step``, if any."""
    every, all_every = args.inject_every, args.all_ranks_every
    if all_every > 0 and step % all_every == 0:
        return float("nan")
    if every > 0 and step % every == 0 and rank in args.inject_ranks:
        return float("inf") if (step // every) % 2 else float("nan")
    return None


def make_model() -> nn.Module:
    import torch
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 1)
    )
    policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    fully_shard(model, mp_policy=policy)
    return model


def poison(model: nn.Module, value: float) -> None:
    """Write ``value`` into this rank's shard of the first layer's weight gradient."""
    import torch

    first = model.get_submodule("0")
    assert isinstance(first.weight, torch.Tensor)
    grad = first.weight.grad
    assert grad is not None
    local = grad.to_local() if hasattr(grad, "to_local") else grad
    local.view(-1)[0] = value


def train(args: argparse.Namespace, stop: threading.Event) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from scalewatch import ShardedGradScaler

    rank = args.rank
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    torch.manual_seed(args.seed)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = ShardedGradScaler(
        "cpu",
        init_scale=args.init_scale,
        growth_interval=args.growth_interval,
        telemetry=args.db,
        run_name=args.name,
    )
    gen = torch.Generator().manual_seed(args.seed * 100 + rank)
    target = torch.randn(IN, 1, generator=torch.Generator().manual_seed(args.seed))
    stop_flag = torch.zeros(1)
    reported = rank != 0
    paced_from = time.monotonic()
    step = 0
    try:
        while args.steps == 0 or step < args.steps:
            if step % STOP_CHECK_EVERY == 0:
                # Every rank stops at the same step, whichever was asked to.
                stop_flag.fill_(float(stop.is_set()))
                dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
                if stop_flag.item():
                    break
            step += 1
            if rank == 0 and args.crash_at and step == args.crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            x = torch.randn(32, IN, generator=gen)
            y = torch.sin(x @ target)
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            value = bad_value(step, rank, args)
            if value is not None:
                poison(model, value)
            scaler.step(optimizer)
            scaler.update()
            if not reported:
                report_run_id(scaler)
                reported = True
            if rank == 0 and args.rate > 0 and step >= args.burst:
                # After the burst, step k starts no earlier than (k - burst) / rate seconds in.
                if step == args.burst:
                    paced_from = time.monotonic()
                due = paced_from + (step - args.burst + 1) / args.rate
                stop.wait(max(0.0, due - time.monotonic()))
    finally:
        scaler.close()
        dist.destroy_process_group()


def report_run_id(scaler: ShardedGradScaler) -> None:
    """Print the run's id once the scaler's writer has created it."""
    deadline = time.monotonic() + RUN_ID_TIMEOUT_S
    while scaler.run_id is None and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({"run_id": scaler.run_id}), flush=True)


def exit_with_parent() -> None:
    """Exit this rank at once if rank 0 goes away (its collectives would only time out)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    others: list[subprocess.Popen[bytes]] = []
    if args.rank > 0:
        exit_with_parent()
    else:
        raw = list(sys.argv[1:] if argv is None else argv)
        for rank in range(1, args.world_size):
            others.append(
                subprocess.Popen(
                    [sys.executable, __file__, *raw, "--rank", str(rank)],
                    stdout=subprocess.DEVNULL,
                )
            )
    try:
        train(args, stop)
    finally:
        for process in others:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
