"""A small transformer language model trained with FSDP2 in fp16 and ``ShardedGradScaler``.

Run it with ``python -m scalewatch.examples.tiny_lm --steps 300 --world-size 2``. It makes its
own text (no downloads), uses gloo on CPU or NCCL on GPUs, and writes every step's
loss-scale state to the store. The initial scale is deliberately high, so the first
steps overflow and back off; afterwards the scale grows every ``growth_interval`` steps
until it overflows again, and a rare batch of noise makes the loss spike.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from .. import ShardedGradScaler
from .._torch_compat import fsdp2

VOCAB = 128
SEQ = 32
NOISE_EVERY = 250
RANK_STOP_S = 20.0  # for the ranks to close their scalers after a Ctrl-C (default)
RANK_STOP_ENV = "SCALEWATCH_RANK_STOP_S"  # another value for it, in seconds
STOP_CHECK_EVERY = 5  # steps between the ranks' checks for a Ctrl-C (each reads a flag)

_WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "bird",
    "scale",
    "loss",
    "grows",
    "falls",
    "step",
    "rank",
    "sees",
    "inf",
    "nan",
    "and",
    "or",
    "on",
    "under",
]


def make_text(rng: random.Random, n_chars: int) -> str:
    """Sentences from a tiny grammar with sums to learn, e.g. ``"the cat sees 3 + 4 = 7. "``."""
    parts: list[str] = []
    size = 0
    while size < n_chars:
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5)))
        sentence = f"{words} {a} + {b} = {a + b}. "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyLM(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Parameter(torch.zeros(SEQ, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        # (tokens, vocab) from a 2-D matmul: a 3-D output would be a view of it, which FSDP2
        # warns about (an in-place op on it would skip the pre-backward hook).
        hidden = self.norm(x)
        logits: torch.Tensor = self.head(hidden.reshape(-1, hidden.shape[-1]))
        return logits


def corpus(rank: int, seed: int) -> torch.Tensor:
    """This rank's text as byte tokens."""
    text = make_text(random.Random(seed * 1000 + rank), 200_000).encode("ascii")
    return torch.tensor(list(text), dtype=torch.long).clamp_(max=VOCAB - 1)


def warmup_cosine(total: int, warmup: float = 0.05, floor: float = 0.1) -> Callable[[int], float]:
    """The learning rate's factor at a step: linear up over the first ``warmup`` of the
    ``total`` steps, then a cosine down to ``floor``.

    >>> f = warmup_cosine(1000)
    >>> round(f(0), 3), f(49), round(f(1000), 3)
    (0.02, 1.0, 0.1)
    """
    ramp = max(1, int(total * warmup))

    def factor(step: int) -> float:
        if step < ramp:
            return (step + 1) / ramp
        done = min(1.0, (step - ramp) / max(1, total - ramp))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

    return factor


def train(rank: int, args: argparse.Namespace, stop: Any, launcher: int) -> None:
    # A rank starts with Ctrl-C ignored (see main): the launcher sets ``stop`` instead, and
    # the ranks agree on it at a step boundary (_stop_agreed), so that none leaves while
    # another waits for it in a collective, and every scaler closes. So do they when the
    # launcher is gone.
    _end_with_launcher(rank_stop_s())
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=args.world_size,
    )
    torch.manual_seed(args.seed)
    model = TinyLM().to(device)
    fsdp = fsdp2()
    policy = fsdp.MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fsdp.fully_shard(block, mp_policy=policy)
    fsdp.fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # As real jobs do: a linear warmup, then a cosine decay (the run page's lr panel).
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.steps))
    scaler = ShardedGradScaler(
        device.type,
        init_scale=2.0**20,
        growth_interval=args.growth_interval,
        telemetry=args.db,
        run_name=args.run_name,
        grad_norm=True,  # each step's gradient norm, on the run page beside the scale
    )
    scaler.watch(model)  # an overflow names its parameters ("blocks.0.mlp.0.weight")
    # The weights do not move on a skipped step: held, nor does the schedule (the run page
    # says "held", drift 0). scaler.watch_schedulers(schedule) would count the drift instead.
    scaler.hold(schedule)
    data = corpus(rank, args.seed)
    gen = torch.Generator().manual_seed(args.seed + rank)
    progress = Progress(args.steps) if rank == 0 else None
    try:
        for step in range(1, args.steps + 1):
            if step % STOP_CHECK_EVERY == 1:
                asked = stop.is_set() or os.getppid() != launcher
                if _stop_agreed(asked, device):
                    break
            starts = torch.randint(0, len(data) - SEQ - 1, (args.batch_size,), generator=gen)
            chunk = torch.stack([data[s : s + SEQ + 1] for s in starts.tolist()])
            if step % NOISE_EVERY == 0:
                chunk = torch.randint(0, VOCAB, chunk.shape, generator=gen)  # a bad batch
            chunk = chunk.to(device)
            optimizer.zero_grad(set_to_none=True)
            logits = model(chunk[:, :-1])
            loss = F.cross_entropy(logits.float(), chunk[:, 1:].reshape(-1))
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            scaler.step(optimizer)
            scaler.update()
            schedule.step()  # held: does nothing after a skipped step
            if progress is not None and progress.due(step):
                progress.show(step, loss.item(), scaler.get_scale())
        scaler.close()
        # Every rank's run written before any group goes: a rank that aborts in torch's
        # gloo teardown (2.13, FSDP) makes the launcher end the others (docs/TRAINING.md).
        dist.barrier()
    finally:
        scaler.close()
        if progress is not None:
            progress.end()
        dist.destroy_process_group()


def _end_with_launcher(grace_s: float) -> None:
    """End this rank at most ``grace_s`` after its launcher ends, however it ends (killed
    outright too): ranks waiting in the rendezvous for ranks never started, or in a
    collective for a rank that is gone, ran on for as long as torch's 30-minute timeout.

    The launcher's end is seen on a pipe it holds (multiprocessing's parent sentinel),
    which the kernel closes whatever ends it. The training loop sees it too
    (``os.getppid()``) and stops with the other ranks at a step, closing its scaler; the
    grace is for that, and only a rank that cannot get there is ended here.
    """
    launcher = multiprocessing.parent_process()
    if launcher is None:  # not started by a launcher: nothing to outlive
        return

    def watch() -> None:
        launcher.join()
        threading.Event().wait(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def rank_stop_s() -> float:
    """Seconds the ranks get to close their scalers once stopped (or their launcher gone):
    ``RANK_STOP_S``, or ``$SCALEWATCH_RANK_STOP_S`` where that is a positive number."""
    raw = os.environ.get(RANK_STOP_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return RANK_STOP_S
    return value if 0 < value < float("inf") else RANK_STOP_S


def max_world_size() -> tuple[int, int]:
    """The CPU cores this process may use (one a rank with gloo) and the GPUs (one a rank
    with NCCL): more ranks than both exhaust the machine, and never all meet."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return cores or 1, gpus


def world_size_refused(world_size: int) -> str | None:
    """Why this machine cannot run ``world_size`` ranks, in one line; None if it can."""
    cores, gpus = max_world_size()
    if world_size <= max(cores, gpus):
        return None
    return (
        f"--world-size {world_size} is more ranks than this machine can run:"
        f" {cores} CPU cores (one a rank, gloo) and {gpus} GPUs (one a rank, NCCL)"
    )


def _stop_agreed(asked: bool, device: torch.device) -> bool:
    """Whether any rank was asked to stop: one small all-reduce, and a read of its result
    (on a GPU, a sync: hence only every STOP_CHECK_EVERY steps)."""
    flag = torch.tensor([float(asked)], device=device)
    dist.all_reduce(flag)
    return bool(flag.item())


class Progress:
    """Rank 0's progress: on a terminal one line redrawn in place (``\\r``) every few steps
    and ended by a newline; anywhere else (a log, a pipe) a plain line now and then."""

    def __init__(self, total: int, out: TextIO | None = None) -> None:
        self.out = sys.stderr if out is None else out
        self.terminal = self.out.isatty()
        self.total = total
        self.every = 5 if self.terminal else 100
        self.started = time.monotonic()
        self.open = False  # a line redrawn in place, not ended yet

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total

    def show(self, step: int, loss: float, scale: float) -> None:
        width = 30
        done = width * step // self.total
        rate = step / max(time.monotonic() - self.started, 1e-9)
        bar = "#" * done + "." * (width - done)
        line = f"[{bar}] step {step}/{self.total}  loss {loss:6.3f}  scale {scale:>10.0f}"
        line += f"  {rate:5.1f} it/s"
        self.out.write(f"\r{line}" if self.terminal else f"{line}\n")
        self.out.flush()
        self.open = self.terminal

    def end(self) -> None:
        if self.open:
            self.out.write("\n")
            self.out.flush()
            self.open = False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--db", default=None, help="store URL (default: $SCALEWATCH_DB)")
    parser.add_argument("--run-name", default="tiny-lm-fp16")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--growth-interval", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=0, help="rendezvous port (default: free)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.world_size < 1:
        parser.error("--steps and --world-size must be >= 1")
    refused = world_size_refused(args.world_size)
    if refused is not None:
        parser.exit(2, f"{parser.prog}: {refused}\n")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.port = args.port or free_port()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parent = os.getppid()
    stop = mp.get_context("spawn").Event()
    context = None
    deferred: list[int] = []
    try:
        # A SIGTERM while the ranks start waits until they have: raised in the middle of
        # starting them, it left a traceback and a rank that could not start.
        signal.signal(signal.SIGTERM, lambda signum, _: deferred.append(signum))
        # The ranks start with Ctrl-C ignored: one while they import torch (seconds) would
        # end them with a traceback each. A Ctrl-C reaches them through ``stop``.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            context = mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
                train, args=(args, stop, os.getpid()), nprocs=args.world_size, join=False
            )
        finally:
            signal.signal(signal.SIGINT, previous)
            # A SIGTERM (the demo's, a process manager's) stops the ranks as a Ctrl-C does.
            signal.signal(signal.SIGTERM, _interrupt)
        if deferred:
            raise KeyboardInterrupt
        while not context.join(timeout=1.0):
            if os.getppid() != parent:  # what started this is gone (a demo killed, say)
                _stop_ranks(context.processes, stop)
                return 1
    except KeyboardInterrupt:
        if context is not None:
            _stop_ranks(context.processes, stop)
        return 130
    return 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _stop_ranks(ranks: Sequence[Any], stop: Any) -> None:
    """Ask the ranks to stop at a step and close their scalers, and give them
    ``rank_stop_s()`` for it. Another Ctrl-C (or SIGTERM) meanwhile terminates them at once."""

    def terminate(*_: object) -> None:
        for rank in ranks:
            if rank.is_alive():
                rank.terminate()

    signal.signal(signal.SIGINT, terminate)
    signal.signal(signal.SIGTERM, terminate)
    stop.set()
    deadline = time.monotonic() + rank_stop_s()
    for rank in ranks:
        rank.join(max(0.0, deadline - time.monotonic()))
    terminate()


if __name__ == "__main__":
    sys.exit(main())
