"""A registered scheduler's drift over skipped steps, and a held scheduler that does not drift.

Overflows are injected at known steps (``_twin.INJECT``: 2, 3 and 7, of 12). A scheduler
stepped after each ``update()`` moves on over a skipped step: the record after it counts
one more. Held, it does nothing there: its ``last_epoch`` is the optimizer's real step
count and its learning rates are those of a run without the skipped steps.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

import scalewatch
from scalewatch.store import open_store
from tests._helpers.stored import db_url, step_rows
from tests._helpers.twin import INJECT, batch, mlp, poison
from tests.scaler._kept_samples import keep_samples

STEPS = 12
SKIPPED = sorted(INJECT)  # the steps (0-based) whose optimizers are skipped


def _warmup_then_decay(step: int) -> float:
    return (step + 1) / 4 if step < 4 else 0.9 ** (step - 4)


Schedule = Callable[[torch.optim.Optimizer], Any]

SCHEDULES: dict[str, Schedule] = {
    "lambda": lambda opt: lr_scheduler.LambdaLR(opt, _warmup_then_decay),
    "onecycle": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=STEPS + 1),
    "sequential": lambda opt: lr_scheduler.SequentialLR(
        opt,
        [lr_scheduler.LinearLR(opt, 0.25, total_iters=3), lr_scheduler.ExponentialLR(opt, 0.9)],
        milestones=[3],
    ),
    "plateau": lambda opt: lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5),
}


def _step(sched: Any, step: int) -> None:
    if isinstance(sched, lr_scheduler.ReduceLROnPlateau):
        sched.step(1.0)  # never better: reduces every step it takes
    else:
        sched.step()


def _train(
    kind: str,
    schedule: Schedule,
    *,
    hold: bool | None,
    inject: dict[int, list[tuple[int, float]]] = INJECT,
    optimizers: int = 1,
    accumulate: int = 1,
    url: str | None = None,
    fused: bool = False,
    device: str = "cpu",
) -> tuple[Any, list[Any], list[list[float]], list[dict[str, Any]]]:
    """``STEPS`` optimizer steps, each of ``accumulate`` backwards, a scheduler per optimizer
    stepped after ``update()``; ``hold``: None (not registered), False (watched), True.
    Returns the scaler, the schedulers, the rates at each step and the stored rows."""
    cls = scalewatch.GradScaler if kind == "plain" else scalewatch.ShardedGradScaler
    gs = cls(device, init_scale=2.0**10, growth_interval=2, telemetry=url or False)
    model = mlp().to(device)
    params = list(model.parameters())
    if optimizers == 1:
        opts = [torch.optim.SGD(params, lr=0.1, momentum=0.9)]
    else:
        opts = [torch.optim.SGD(params[:2], lr=0.1), torch.optim.Adam(params[2:], lr=0.01)]
    if fused:
        opts = [torch.optim.Adam(params, lr=0.01, fused=True)]
    scheds = [schedule(opt) for opt in opts]
    if hold is not None:
        (gs.hold if hold else gs.watch_schedulers)(*scheds)
    rates = []
    for step in range(STEPS):
        for opt in opts:
            opt.zero_grad()
        for micro in range(accumulate):
            x = batch(step * accumulate + micro).to(device)
            loss = model(x).pow(2).mean() / accumulate
            gs.scale(loss).backward()
        for index, value in inject.get(step, []):
            poison(params, index, value)
        rates.append([float(g["lr"]) for opt in opts for g in opt.param_groups])
        for opt in opts:
            gs.step(opt)
        gs.update()
        for sched in scheds:
            _step(sched, step)
    rows: list[dict[str, Any]] = []
    if url is not None:
        assert gs.flush(30)
        run_id = gs.run_id
        gs.close()
        with open_store(url) as store:
            rows = step_rows(store, run_id)
    return gs, scheds, rates, rows


def _expected_drift() -> list[int]:
    """Record k (1-based) counts the skipped steps before it: its own scheduler call comes
    after its update()."""
    return [sum(1 for s in SKIPPED if s < k - 1) for k in range(1, STEPS + 1)]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_drift_counts_the_skipped_steps_a_scheduler_stepped_on(
    kind: str, name: str, tmp_path: Path
) -> None:
    _, scheds, _, rows = _train(kind, SCHEDULES[name], hold=False, url=db_url(tmp_path / "a.db"))
    assert [r["skipped"] for r in rows] == [s in INJECT for s in range(STEPS)]
    assert [r["schedule_drift"] for r in rows] == _expected_drift()
    assert scheds[0].last_epoch == STEPS  # torch's behaviour: it stepped every time


@pytest.mark.parametrize("optimizers,accumulate", [(2, 1), (1, 3), (2, 2)])
def test_several_optimizers_and_accumulation_drift_once_a_skipped_step(
    kind: str, optimizers: int, accumulate: int, tmp_path: Path
) -> None:
    _, scheds, _, rows = _train(
        kind,
        SCHEDULES["lambda"],
        hold=False,
        optimizers=optimizers,
        accumulate=accumulate,
        url=db_url(tmp_path / "a.db"),
    )
    assert [r["schedule_drift"] for r in rows] == _expected_drift()
    assert [s.last_epoch for s in scheds] == [STEPS] * optimizers


def _fused_supported(device: str) -> bool:
    try:
        torch.optim.Adam([nn.Parameter(torch.ones(1, device=device))], fused=True)
    except (RuntimeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("hold", [False, True], ids=["watched", "held"])
def test_a_fused_optimizer_drifts_and_holds_alike(
    kind: str, device: str, hold: bool, tmp_path: Path
) -> None:
    """A fused optimizer decides on the device (``_check_inf_per_device``): the recorder
    counts its skips from the found_inf it reads; a held scheduler on a GPU waits for the
    step's found_inf (the one sync of that path)."""
    if not _fused_supported(device):
        pytest.skip(f"no fused Adam on {device} here")
    _, scheds, _, rows = _train(
        kind, SCHEDULES["lambda"], hold=hold, fused=True, device=device,
        url=db_url(tmp_path / "a.db"),
    )  # fmt: skip
    assert [r["skipped"] for r in rows] == [s in INJECT for s in range(STEPS)]
    if hold:
        assert {r["schedule_drift"] for r in rows} == {0}
        assert scheds[0].last_epoch == STEPS - len(SKIPPED)
    else:
        assert [r["schedule_drift"] for r in rows] == _expected_drift()
        assert scheds[0].last_epoch == STEPS


def test_no_registered_scheduler_records_no_drift(tmp_path: Path) -> None:
    *_, rows = _train("plain", SCHEDULES["lambda"], hold=None, url=db_url(tmp_path / "a.db"))
    assert {r["schedule_drift"] for r in rows} == {None}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_held_scheduler_keeps_the_optimizers_count_and_the_clean_runs_rates(
    kind: str, name: str, tmp_path: Path
) -> None:
    gs, scheds, rates, rows = _train(
        kind, SCHEDULES[name], hold=True, url=db_url(tmp_path / "a.db")
    )
    assert {r["schedule_drift"] for r in rows} == {0}
    assert gs.stats().skipped == len(SKIPPED)
    assert scheds[0].last_epoch == STEPS - len(SKIPPED)
    # The same schedule, no overflow: its rates at the real steps are the held run's.
    _, _, clean, _ = _train(kind, SCHEDULES[name], hold=None, inject={})
    taken = [rates[s] for s in range(STEPS) if s not in INJECT]
    assert taken == clean[: len(taken)]


def test_hold_is_per_scheduler_and_off_by_default() -> None:
    _, (sched,), _, _ = _train("plain", SCHEDULES["lambda"], hold=False)
    assert sched.last_epoch == STEPS
    _, (plain,), _, _ = _train("plain", SCHEDULES["lambda"], hold=None)
    assert plain.state_dict().keys() == sched.state_dict().keys()  # nothing of ours added


def test_a_held_schedulers_state_round_trips_and_a_resumed_job_keeps_holding() -> None:
    gs, (sched,), _, _ = _train("plain", SCHEDULES["lambda"], hold=True)
    state = sched.state_dict()
    assert "step" not in state and "state_dict" not in state  # the wrappers stay behind
    restored = pickle.loads(pickle.dumps(state))  # what torch.save keeps

    # The resumed job registers its new scheduler, as the first did, and loads the state.
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)
    resumed = lr_scheduler.LambdaLR(opt, _warmup_then_decay)
    gs.watch_schedulers(resumed)
    resumed.load_state_dict(restored)
    assert resumed.last_epoch == sched.last_epoch
    model = mlp()
    gs2 = scalewatch.GradScaler("cpu", init_scale=2.0**10, telemetry=False)
    opt2 = torch.optim.SGD(model.parameters(), lr=0.1)
    again = lr_scheduler.LambdaLR(opt2, _warmup_then_decay)
    gs2.watch_schedulers(again)
    again.load_state_dict(restored)
    params = list(model.parameters())
    for step in range(2):
        opt2.zero_grad()
        gs2.scale(model(batch(step)).pow(2).mean()).backward()
        if step == 0:
            poison(params, 0, float("inf"))
        gs2.step(opt2)
        gs2.update()
        again.step()
    assert again.last_epoch == sched.last_epoch + 1  # held on the skipped one


def test_a_pickled_scheduler_comes_back_plain() -> None:
    _gs, (sched,), _, _ = _train("plain", SCHEDULES["sequential"], hold=True)
    copy = pickle.loads(pickle.dumps(sched))
    assert type(copy.step).__name__ == "method"
    copy.step()  # its class's own step: not held, and no scaler asked
    assert copy.last_epoch == sched.last_epoch + 1


def test_torchs_warning_of_a_step_before_the_optimizers_is_kept() -> None:
    """A first step that overflows: unheld, torch warns that the scheduler stepped before
    the optimizer (it did); held, the scheduler waits for the first real step."""
    first = {0: [(0, float("inf"))]}
    for hold, warns in ((False, True), (True, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _train("plain", SCHEDULES["lambda"], hold=hold, inject=first)
        said = [w for w in caught if "before `optimizer.step()`" in str(w.message)]
        assert bool(said) is warns, hold


def test_a_scheduler_stepped_before_update_belongs_to_the_step_in_progress(
    tmp_path: Path,
) -> None:
    url = db_url(tmp_path / "a.db")
    gs = scalewatch.GradScaler("cpu", init_scale=2.0**10, telemetry=url)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watched = lr_scheduler.LambdaLR(opt, _warmup_then_decay)
    held = lr_scheduler.StepLR(opt, 100)
    gs.watch_schedulers(watched)
    gs.hold(held)
    params = list(model.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        gs.scale(model(batch(step)).pow(2).mean()).backward()
        for index, value in INJECT.get(step, []):
            poison(params, index, value)
        gs.step(opt)
        watched.step()
        held.step()
        gs.update()
    assert gs.flush(30)
    run_id = gs.run_id
    gs.close()
    with open_store(url) as store:
        rows = step_rows(store, run_id)
    assert [r["schedule_drift"] for r in rows] == [
        sum(1 for s in SKIPPED if s <= k) for k in range(STEPS)
    ]
    assert held.last_epoch == STEPS - len(SKIPPED)


def test_the_runs_config_lists_the_schedulers_and_whether_they_hold(tmp_path: Path) -> None:
    url = db_url(tmp_path / "a.db")
    _, _, _, _ = _train("plain", SCHEDULES["lambda"], hold=True, url=url)
    with open_store(url) as store:
        from scalewatch.store.queries import list_runs

        (run,) = list_runs(store)
    assert run.config["schedulers"] == [{"name": "LambdaLR", "held": True}]


def test_registering_something_else_is_refused() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    with pytest.raises(TypeError, match="expected a learning-rate scheduler"):
        gs.hold(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1))


class _Recorded(scalewatch.ShardedGradScaler):
    """Ours, keeping the records the recorder hands to telemetry (testing only)."""

    def _reset_transient(self) -> None:
        super()._reset_transient()
        self.samples = keep_samples(self)


RANK1_INF = {2, 5, 6}  # steps whose gradients hold inf on rank 1 only


def _ranked(rank: int, world: int, kind: str) -> dict[str, Any]:
    """A model wrapped by ``kind`` (DDP, FSDP1, FSDP2) on each rank, inf on rank 1 only:
    every rank skips alike (the all-reduce)."""
    from tests._helpers.nets import wrap

    model = wrap(kind, mlp(), "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    held = lr_scheduler.LambdaLR(opt, _warmup_then_decay)
    watched = lr_scheduler.StepLR(opt, 100)
    gs = _Recorded("cpu", init_scale=2.0**10, growth_interval=2)
    gs.hold(held)
    gs.watch_schedulers(watched)
    params = list(model.parameters())
    rates, skips = [], []
    for step in range(STEPS):
        opt.zero_grad()
        gs.scale(model(batch(step + rank)).float().pow(2).mean()).backward()
        if rank == 1 and step in RANK1_INF:
            _poison_local(params[0], float("inf"))
        rates.append(float(opt.param_groups[0]["lr"]))
        gs.step(opt)
        gs.update()
        skips.append(gs.last_step_skipped)
        held.step()
        watched.step()
    gs.flush(30)
    samples = getattr(gs, "samples", None)
    gs.close()
    return {
        "held": held.last_epoch,
        "watched": watched.last_epoch,
        "rates": rates,
        "skips": skips,
        "drift": None if samples is None else [s.record.schedule_drift for s in samples],
        "lr": None if samples is None else [s.record.lr for s in samples],
    }


def _poison_local(param: torch.Tensor, value: float) -> None:
    """This rank's part of ``param``'s gradient gets ``value`` (a DTensor's local shard)."""
    grad = param.grad
    assert grad is not None
    inner = getattr(grad, "_local_tensor", grad)
    with torch.no_grad():
        inner.view(-1)[0].fill_(value)


@pytest.mark.parametrize("kind", ["ddp", "fsdp1", "fsdp2"])
def test_two_real_ranks_agree_on_skips_rates_holding_and_drift(kind: str) -> None:
    from tests._helpers.ranks import run_ranks

    first, second = run_ranks(_ranked, 2, kind, timeout=120.0)
    assert first["held"] == second["held"] == STEPS - len(RANK1_INF)
    assert first["watched"] == second["watched"] == STEPS
    assert first["rates"] == second["rates"]  # one schedule, on both ranks
    # Every rank knows at once which steps skipped, and records the rate each step used.
    assert first["skips"] == second["skips"] == [s in RANK1_INF for s in range(STEPS)]
    assert first["lr"] == second["lr"] == first["rates"]
    assert first["drift"] == [sum(1 for s in RANK1_INF if s < k - 1) for k in range(1, STEPS + 1)]
    assert second["drift"] == first["drift"]  # each rank's recorder counts alike
