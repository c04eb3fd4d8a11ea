"""DDP on gloo, freed before its process group as docs/TRAINING.md shows: no hang at exit.

Freed after ``destroy_process_group()``, a DDP model destroys the group itself while
holding the GIL, and the group joins a worker thread that may need the GIL to let go of
the last gradient all-reduce: a hang (torch's, with torch's own scaler too). Each cycle
here is a whole job's life, run quickly one after another so that the last all-reduce is
still being let go of when the job ends; in the other order, a hang comes within a few
cycles.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import scalewatch
from tests._helpers.ranks import run_ranks

CYCLES = 40


def _job(rank: int, world: int, store: str) -> None:
    """docs/TRAINING.md's DDP example, shortened: its locals are freed as it returns."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gs = scalewatch.ShardedGradScaler("cpu", telemetry=False)
    for _ in range(3):
        optimizer.zero_grad()
        gs.scale(model(torch.randn(8, 16)).pow(2).mean()).backward()
        gs.step(optimizer)
        gs.update()
    gs.close()
    del model
    dist.destroy_process_group()


def _jobs(rank: int, world: int, folder: str) -> int:
    for cycle in range(CYCLES):
        _job(rank, world, Path(folder, f"store-{cycle}").as_uri())
    return CYCLES


@pytest.mark.heavy
def test_ddp_freed_before_its_group_never_hangs_the_exit(tmp_path: Path) -> None:
    done = run_ranks(_jobs, 2, str(tmp_path), group=False, timeout=120)
    assert done == [CYCLES, CYCLES]


# The scaler's module is imported on first use, here while a group exists; torch's
# default argument, dist.group.WORLD, would then be that group, gone at the next job.
JOB_AFTER_JOB = """
import sys

import torch
import torch.distributed as dist

import scalewatch
for store in sys.argv[1:]:
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    gs = scalewatch.ShardedGradScaler("cpu", telemetry=False)
    gs._reduce_alone = True  # all-reduce in the group of one, as a bigger group does
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.SGD([param], lr=0.1)
    param.grad = torch.full_like(param, float("inf"))
    gs.scale(torch.ones(()))
    gs.step(optimizer)
    gs.update()
    print(gs.get_scale(), gs.had_overflow())
    gs.close()
    dist.destroy_process_group()
"""


@pytest.mark.heavy
def test_a_scaler_made_in_a_later_job_uses_that_jobs_group(tmp_path: Path) -> None:
    stores = [Path(tmp_path, f"store-{job}").as_uri() for job in range(2)]
    done = subprocess.run(
        [sys.executable, "-c", JOB_AFTER_JOB, *stores],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["32768.0 True", "32768.0 True"]
