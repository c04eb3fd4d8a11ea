"""A scaler's state loaded into a run that has steps is recorded in it, jump or not.

In one process (the run's telemetry still open), in a new process resuming the run (the
scale before is the run's last stored one), and on 2 real ranks (one event, the reporting
rank's). A load before any step of a run of its own records nothing.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select
from torch import nn

import scalewatch
from scalewatch.store import open_store
from scalewatch.store.scale_loads import ScaleLoadRow, scale_loads_of
from scalewatch.store.schema import runs, steps
from tests._helpers.ranks import run_ranks
from tests._helpers.twin import mlp, sgd, train_step


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sw.db'}"


def _loads(url: str, run_id: int) -> list[ScaleLoadRow]:
    with open_store(url) as store:
        return scale_loads_of(store, run_id)


def _last_scale(url: str, run_id: int) -> float:
    query = select(steps.c.scale_after).where(steps.c.run_id == run_id).order_by(steps.c.step)
    with open_store(url) as store, store.read() as conn:
        return float(conn.execute(query).scalars().all()[-1])


def _trained(url: str, steps_taken: int) -> tuple[Any, nn.Module, torch.optim.Optimizer]:
    model = mlp()
    opt = sgd(model)[0]
    gs = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    for step in range(1, steps_taken + 1):
        train_step(gs, model, opt, step)
    return gs, model, opt


@pytest.mark.parametrize("how", ["state_dict", "checkpoint"])
def test_a_load_with_another_scale_is_a_jump_at_that_step(how: str, tmp_path: Path) -> None:
    url = _url(tmp_path)
    gs, model, opt = _trained(url, 4)
    before = gs.get_scale()
    if how == "state_dict":
        state = gs.state_dict()
        gs.load_state_dict({**state, "scale": 8.0})
    else:
        gs.load_checkpoint(dataclasses.replace(gs.checkpoint(), scale=8.0))
    for step in range(5, 7):
        train_step(gs, model, opt, step)
    assert gs.flush(30)
    run_id = gs.run_id
    assert run_id is not None
    gs.close()

    (load,) = _loads(url, run_id)
    assert (load.step, load.from_step, load.scale_before, load.scale_after, load.jump) == (
        4,
        4,
        before,
        8.0,
        True,
    )
    with open_store(url) as store, store.read() as conn:
        step5 = conn.execute(select(steps.c.scale).where(steps.c.step == 5)).scalar_one()
    assert step5 == 8.0  # the step after the load used the loaded scale


def test_a_load_of_the_same_scale_is_recorded_without_a_jump(tmp_path: Path) -> None:
    url = _url(tmp_path)
    gs, model, opt = _trained(url, 3)
    gs.load_state_dict(gs.state_dict())
    train_step(gs, model, opt, 4)
    assert gs.flush(30)
    run_id = gs.run_id
    assert run_id is not None
    scale = gs.get_scale()
    gs.close()
    (load,) = _loads(url, run_id)
    assert (load.step, load.from_step, load.jump) == (3, 3, False)
    assert load.scale_before == load.scale_after
    assert load.scale_after in (scale, scale / 2)  # step 4 may grow it; the load did not


def test_rolling_back_to_an_earlier_checkpoint_is_at_its_step(tmp_path: Path) -> None:
    url = _url(tmp_path)
    model = mlp()
    opt = sgd(model)[0]
    gs = scalewatch.GradScaler("cpu", growth_interval=1, telemetry=url)
    for step in range(1, 3):
        train_step(gs, model, opt, step)
    early = gs.checkpoint()
    for step in range(3, 6):
        train_step(gs, model, opt, step)
    at_five = gs.get_scale()
    gs.load_checkpoint(early)
    assert gs.flush(30)
    run_id = gs.run_id
    assert run_id is not None
    gs.close()
    (load,) = _loads(url, run_id)
    assert (load.step, load.from_step) == (2, 5)
    assert (load.scale_before, load.scale_after) == (at_five, early.scale)
    assert load.jump  # growth_interval=1: the scale grew every clean step since
    assert at_five != early.scale


def test_a_new_process_resuming_the_run_compares_with_its_last_stored_scale(
    tmp_path: Path,
) -> None:
    url = _url(tmp_path)
    first, model, opt = _trained(url, 4)
    state = first.state_dict()
    assert first.flush(30)
    run_id = first.run_id
    assert run_id is not None
    first.close()
    stored = _last_scale(url, run_id)

    # As a resumed job does: a new scaler loads the checkpoint before its first step.
    jumped = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    jumped.load_state_dict({**state, "scale": stored * 64})
    for step in range(5, 7):
        train_step(jumped, model, opt, step)
    assert jumped.flush(30)
    assert jumped.run_id == run_id
    state = jumped.state_dict()
    jumped.close()

    same = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    same.load_state_dict(state)
    train_step(same, model, opt, 7)
    assert same.flush(30)
    same.close()

    first_load, second_load = _loads(url, run_id)
    assert (first_load.step, first_load.from_step, first_load.jump) == (4, 4, True)
    assert (first_load.scale_before, first_load.scale_after) == (stored, stored * 64)
    assert (second_load.step, second_load.from_step, second_load.jump) == (6, 6, False)
    assert second_load.scale_before == second_load.scale_after == state["scale"]


def test_no_event_for_a_load_before_any_step_of_a_run_of_its_own(tmp_path: Path) -> None:
    url = _url(tmp_path)
    model = mlp()
    opt = sgd(model)[0]
    # A torch dict starts a run of its own: its first scale is the loaded one.
    fresh = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    fresh.load_state_dict(torch.amp.GradScaler("cpu", init_scale=64.0).state_dict())
    train_step(fresh, model, opt, 1)
    assert fresh.flush(30)
    fresh_id = fresh.run_id
    assert fresh_id is not None
    fresh.close()
    # Ours, of a run that this store has never seen: the run starts here, without steps.
    other = _url(tmp_path / "other")
    (tmp_path / "other").mkdir()
    elsewhere, _, _ = _trained(other, 2)
    state = elsewhere.state_dict()
    elsewhere.close()
    moved = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    moved.load_state_dict(state)
    train_step(moved, model, opt, 3)
    assert moved.flush(30)
    moved_id = moved.run_id
    assert moved_id is not None
    moved.close()
    assert _loads(url, fresh_id) == [] and _loads(url, moved_id) == []


def test_a_scaler_without_telemetry_records_nothing_and_loads_as_before(tmp_path: Path) -> None:
    model = mlp()
    opt = sgd(model)[0]
    gs = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=False)
    reference = torch.amp.GradScaler("cpu", growth_interval=2)
    for step in range(1, 4):
        train_step(gs, model, opt, step)
    state = {**gs.state_dict(), "scale": 4.0}
    gs.load_state_dict(state)
    reference.load_state_dict({k: v for k, v in state.items() if k != "scalewatch"})
    assert gs.get_scale() == reference.get_scale() == 4.0
    assert gs._session.telemetry is None and gs._session.pending_load is None


# ------------------------------------------------------------ a job resumed in a new process

ROOT = Path(__file__).resolve().parents[2]
JOB = """
import sys, torch, scalewatch
from torch import nn
url, checkpoint, phase = sys.argv[1:]
torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gs = scalewatch.GradScaler("cpu", growth_interval=1, telemetry=url)
if phase == "resume":
    gs.load_state_dict(torch.load(checkpoint))
for step in range(gs.steps + 1, gs.steps + 9 if phase == "first" else gs.steps + 3):
    opt.zero_grad()
    gs.scale(model(torch.randn(6, 4)).pow(2).mean()).backward()
    gs.step(opt)
    gs.update()
    if phase == "first" and step == 4:
        torch.save(gs.state_dict(), checkpoint)
print(gs.run_uid, gs.get_scale())
"""


def _job(url: str, checkpoint: Path, phase: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", JOB, url, str(checkpoint), phase],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
        check=True,
    )
    return done.stdout.split()


def test_a_job_resumed_from_an_older_checkpoint_records_the_jump(tmp_path: Path) -> None:
    """The job ran to step 8 (the scale growing at every clean step) and saved the state of
    step 4; the next job loads it, in a process of its own."""
    url, checkpoint = _url(tmp_path), tmp_path / "scalewatch.pt"
    uid, at_eight = _job(url, checkpoint, "first")
    saved = torch.load(checkpoint)["scale"]
    assert _job(url, checkpoint, "resume")[0] == uid  # the same run, continued
    with open_store(url) as store:
        (run,) = [r for r in _runs(store) if r["uid"] == uid]
        (load,) = scale_loads_of(store, run["id"])
    assert (load.step, load.from_step, load.jump) == (4, 8, True)
    assert (load.scale_before, load.scale_after) == (float(at_eight), saved)


def _runs(store: Any) -> list[dict[str, Any]]:
    with store.read() as conn:
        return [dict(row._mapping) for row in conn.execute(select(runs))]


# ------------------------------------------------------------ 2 ranks, one event


def _sharded_load(rank: int, world: int, url: str) -> int | None:
    model = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gs = scalewatch.ShardedGradScaler("cpu", growth_interval=2, telemetry=url, run_name="loads")
    for step in range(1, 5):
        train_step(gs, model, opt, step * world + rank)
    gs.load_state_dict({**gs.state_dict(), "scale": 2.0})
    train_step(gs, model, opt, 99)
    assert gs.flush(30)
    run_id = gs.run_id
    gs.close()
    return run_id


@pytest.mark.slow
def test_a_sharded_load_on_two_ranks_is_one_event(tmp_path: Path) -> None:
    url = _url(tmp_path)
    run_ids = run_ranks(_sharded_load, 2, url, timeout=120.0)
    assert run_ids[1] is None  # a rank that does not report has no run
    run_id = run_ids[0]
    assert run_id is not None
    (load,) = _loads(url, run_id)
    assert (load.step, load.scale_after, load.jump) == (4, 2.0, True)
    with open_store(url) as store, store.read() as conn:
        rows = conn.execute(select(steps.c.step).where(steps.c.run_id == run_id)).all()
    assert len(rows) == 5
