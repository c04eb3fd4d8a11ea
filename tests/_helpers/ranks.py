"""Real gloo process groups for the scaler tests: ranks spawned on 127.0.0.1, results collected."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from tests._helpers.net import free_port

# A worker is called as fn(rank, world, *args) inside an initialised gloo group; what it returns
# (picklable) is handed back to the test.
Worker = Callable[..., Any]

# How long a rank that has sent its result may take to leave before it is killed.
_EXIT_S = 20.0


def _entry(
    rank: int,
    world: int,
    port: int,
    fn: Worker,
    args: tuple[Any, ...],
    results: Any,
    group: bool,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    try:
        import torch

        torch.set_num_threads(1)
        if group:
            dist.init_process_group(
                "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60)
            )
        value = fn(rank, world, *args)
    except BaseException:
        _send(results, (rank, "error", traceback.format_exc()))
        return
    _send(results, (rank, "ok", value))
    if group:
        leave_group()


def leave_group() -> None:
    """Destroy this process's default group, after a barrier.

    torch 2.4's gloo destroys its group holding the GIL, joining worker threads; one still
    letting go of a tensor a collective used needs the GIL: a hang. A barrier first waits
    (GIL released) for the work before it to be done with.
    """
    dist.barrier()
    dist.destroy_process_group()


def _send(results: Any, item: tuple[int, str, Any]) -> None:
    """Put ``item`` and wait until it has left this process: a queue's feeder thread sends
    it, and a teardown that then holds the GIL would keep it from ever doing so."""
    results.put(item)
    results.close()
    results.join_thread()


class Ranks:
    """``fn`` running on ``world`` spawned ranks; a context manager that never leaves one behind.

    Start it, do what the test does meanwhile (the ranks run), then :meth:`results`.
    On exit every rank still alive is killed, so a hung collective never hangs the test.
    """

    def __init__(self, fn: Worker, world: int, *args: Any, group: bool = True) -> None:
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        port = free_port()
        self._procs = [
            ctx.Process(
                target=_entry,
                args=(rank, world, port, fn, args, self._results, group),
                daemon=True,
            )
            for rank in range(world)
        ]
        self.world = world

    def __enter__(self) -> Ranks:
        for proc in self._procs:
            proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)
        self._results.close()
        self._results.join_thread()

    def results(self, timeout: float = 120.0) -> list[Any]:
        """Each rank's result, in rank order; raises with a failed rank's traceback."""
        deadline = time.monotonic() + timeout
        got: dict[int, Any] = {}
        while len(got) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self.world)) - set(got))
                raise TimeoutError(f"ranks {missing} did not finish")
            try:
                rank, status, value = self._results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [
                    r for r, p in enumerate(self._procs) if r not in got and p.exitcode is not None
                ]
                if dead:
                    raise RuntimeError(f"ranks {dead} died without a result") from None
                continue
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            got[rank] = value
        for proc in self._procs:  # a rank hung in its teardown is killed on exit
            proc.join(min(_EXIT_S, max(0.1, deadline - time.monotonic())))
        return [got[rank] for rank in range(self.world)]


def run_ranks(
    fn: Worker, world: int, *args: Any, timeout: float = 120.0, group: bool = True
) -> list[Any]:
    """Run ``fn`` on ``world`` spawned ranks and return each rank's result, in rank order.

    ``group=False``: no process group around ``fn``, which makes its own.
    """
    with Ranks(fn, world, *args, group=group) as ranks:
        return ranks.results(timeout)
