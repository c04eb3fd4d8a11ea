"""Runtime control: a request in the store applies on every rank at the same step, or not at all."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

import scalewatch
from scalewatch.store import ControlValidationError, RunNotRunning, Store, open_store
from scalewatch.store import control as store_control
from scalewatch.store.control import control_history, control_state, request_control
from scalewatch.store.runs import create_run, end_run
from scalewatch.store.schema import control_requests, runs, steps
from scalewatch.telemetry import TelemetrySettings
from tests._helpers.ranks import Ranks
from tests._helpers.twin import batch, mlp, sgd, train_step
from tests._helpers.waiting import wait_for

INIT = 2.0**16
PAUSE_AT = 30  # every rank waits at this step until the test has queued its requests
SENTINEL = 0.25  # backoff_factor of the last request: once in effect, every rank stops soon


def db_url(path: Path) -> str:
    return f"sqlite:///{path}"


def step_rows(store: Store, run_id: int) -> list[dict[str, Any]]:
    with store.read() as conn:
        query = select(steps).where(steps.c.run_id == run_id).order_by(steps.c.step)
        return [dict(row._mapping) for row in conn.execute(query)]


def state_of(gs: Any) -> dict[str, Any]:
    return {**gs.control_state(), "version": gs._control_version}


# ------------------------------------------------------------ real ranks


def _controlled(
    rank: int, world: int, url: str, go: str, device: str = "cpu", fused: bool = False
) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(mlp(seed=0).to(device))
    # fused Adam steps on the device: no host read of the payload, so the request's flag
    # and then the request itself reach the host one update later (scaler/_agreement/host_copies.py)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True) if fused else sgd(model)[0]
    gs = scalewatch.ShardedGradScaler(
        device, init_scale=INIT, growth_interval=1000, telemetry=url, run_name=f"control-{world}"
    )
    scales: list[float] = []
    states: list[dict[str, Any]] = []
    stop_at = None
    for step in range(1, 3001):
        opt.zero_grad()
        gs.scale(model(batch(step * world + rank).to(device)).pow(2).mean()).backward()
        if rank == world - 1 and step % 7 == 0:
            grad = model.module[0].weight.grad
            grad.view(-1)[0] = float("inf")
        gs.step(opt)
        gs.update()
        scales.append(gs.get_scale())
        states.append(state_of(gs))
        if step == PAUSE_AT:
            wait_for(lambda: Path(go).exists(), 60, "the test to queue its requests")
        if stop_at is None and gs.control_state()["backoff_factor"] == SENTINEL:
            stop_at = step + 3
        if step == stop_at:
            break
        time.sleep(0.005)
    if gs._session.telemetry is not None:
        assert gs.flush(30)
    result = {"scales": scales, "states": states, "run_id": gs.run_id}
    gs.close()
    return result


def _first_step(states: list[dict[str, Any]], key: str, value: Any) -> int:
    return next(i + 1 for i, s in enumerate(states) if s[key] == value)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "device", "fused"),
    [
        (2, "cpu", False),
        (4, "cpu", False),
        pytest.param(2, "cuda", False, marks=pytest.mark.cuda, id="2-cuda"),
        pytest.param(2, "cuda", True, marks=pytest.mark.cuda, id="2-cuda-fused"),
    ],
    ids=["2", "4", "2-cuda", "2-cuda-fused"],
)
def test_requests_apply_on_every_rank_at_the_same_step(
    tmp_path: Path, world: int, device: str, fused: bool
) -> None:
    """On cuda the ranks share the one GPU (gloo all-reduces cuda tensors)."""
    url = db_url(tmp_path / "sw.db")
    go = tmp_path / "go"
    with Ranks(_controlled, world, url, str(go), device, fused) as ranks:
        store = open_store(url)

        def paused_run() -> int | None:
            with store.read() as conn:
                row = conn.execute(select(runs.c.id, runs.c.last_step)).first()
            return row.id if row is not None and row.last_step >= PAUSE_AT else None

        run_id = wait_for(paused_run, 150, f"the ranks to reach step {PAUSE_AT}")
        growth = request_control(
            store, run_id, {"growth_interval": 3, "growth_factor": 4.0}, requested_by="test"
        )
        cap = request_control(store, run_id, {"max_scale": 2.0**20}, requested_by="test")
        # Valid now, against the values in effect; refused once the cap above applies.
        floor = request_control(store, run_id, {"min_scale": 2.0**21}, requested_by="test")
        last = request_control(store, run_id, {"backoff_factor": SENTINEL}, requested_by="test")
        go.touch()
        results = ranks.results(timeout=150)
    history = {row.id: row for row in control_history(store, run_id)}
    rows = step_rows(store, run_id)
    store.close()

    scales, states = results[0]["scales"], results[0]["states"]
    for other in results[1:]:
        assert other["scales"] == scales
        assert other["states"] == states
    applied = _first_step(states, "growth_interval", 3)
    assert applied > PAUSE_AT
    assert states[applied - 1]["growth_factor"] == 4.0
    assert states[applied - 2]["growth_interval"] == 1000
    assert history[growth.id].status == "applied"
    assert history[growth.id].applied_step == applied
    assert history[cap.id].applied_step == _first_step(states, "max_scale", 2.0**20)
    assert history[last.id].applied_step == _first_step(states, "backoff_factor", SENTINEL)

    refused = history[floor.id]
    assert refused.status == "rejected" and "min_scale" in (refused.reason or "")
    assert refused.applied_step is not None
    assert states[refused.applied_step - 1] == states[refused.applied_step - 2]
    assert all(s["min_scale"] is None for s in states)

    # The store's rows are rank 0's steps, with the new values from the applied step on.
    assert [r["step"] for r in rows] == list(range(1, len(scales) + 1))
    assert [r["scale_after"] for r in rows] == scales
    assert [r["control_version"] for r in rows] == [s["version"] for s in states]
    for r in rows:
        new = r["step"] >= applied
        assert (r["growth_interval"], r["growth_factor"]) == ((3, 4.0) if new else (1000, 2.0))
    assert [r["inf_ranks"] for r in rows if r["overflow"]] == [str(world - 1)] * (len(scales) // 7)
    # The new factor is used: no growth before the change, growth by 4 after it, then the cap.
    assert all(b <= a for a, b in itertools.pairwise(scales[: applied - 1]))
    after = scales[applied - 1 :]
    assert any(b == 4.0 * a for a, b in itertools.pairwise(after))
    capped = history[cap.id].applied_step
    assert capped is not None and max(scales[capped - 1 :]) <= 2.0**20


# ------------------------------------------------------------ single process


def _status(store: Store, request_id: int) -> str:
    with store.read() as conn:
        return str(
            conn.execute(
                select(control_requests.c.status).where(control_requests.c.id == request_id)
            ).scalar_one()
        )


def _wait_inbox(gs: Any, count: int) -> None:
    wait_for(lambda: len(gs._inbox) >= count, 10, f"{count} request(s) in the scaler's inbox")


def test_idle_polls_only_probe_and_a_request_is_still_picked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll that finds nothing costs one cheap statement, not the full read of requests."""
    probes: list[int] = []
    reads: list[int] = []
    probe_call, read = store_control.PendingProbe.__call__, store_control.pending_requests

    def counted_probe(self: Any, run_id: int) -> bool:
        probes.append(run_id)
        return probe_call(self, run_id)

    def counted_read(store: Store, run_id: int) -> Any:
        reads.append(run_id)
        return read(store, run_id)

    monkeypatch.setattr(store_control.PendingProbe, "__call__", counted_probe)
    monkeypatch.setattr(store_control, "pending_requests", counted_read)
    url = db_url(tmp_path / "sw.db")
    model = mlp()
    opt = sgd(model)[0]
    settings = TelemetrySettings(url, writer="thread")  # the polls counted in this process
    gs = scalewatch.GradScaler("cpu", init_scale=INIT, growth_interval=1000, telemetry=settings)
    train_step(gs, model, opt, 1)
    assert gs.flush(30)
    wait_for(lambda: len(probes) >= 3, 10, "three polls")
    assert reads == []
    store = open_store(url)
    request = request_control(store, gs.run_id, {"growth_factor": 3.0}, requested_by="test")
    _wait_inbox(gs, 1)
    assert reads and set(reads) == set(probes) == {gs.run_id}
    train_step(gs, model, opt, 2)
    assert gs.flush(30)
    assert _status(store, request.id) == "applied"
    gs.close()
    store.close()


@pytest.mark.parametrize("cls", [scalewatch.GradScaler, scalewatch.ShardedGradScaler])
def test_single_process_applies_at_the_next_update(tmp_path: Path, cls: type) -> None:
    url = db_url(tmp_path / "sw.db")
    model = mlp()
    opt = sgd(model)[0]
    gs = cls("cpu", init_scale=INIT, growth_interval=1000, telemetry=url)
    for step in range(1, 11):
        train_step(gs, model, opt, step)
    assert gs.flush(30)
    store = open_store(url)
    run_id = gs.run_id

    # Lowering growth_interval below the tracker (10) grows at the next clean step.
    lower = request_control(
        store, run_id, {"growth_interval": 4, "growth_factor": 3.0}, requested_by="test"
    )
    _wait_inbox(gs, 1)
    train_step(gs, model, opt, 11)
    assert gs._growth_interval == 4 and gs._get_growth_tracker() <= 3
    train_step(gs, model, opt, 12)
    assert gs.get_scale() == INIT * 3.0

    # Two requests valid one by one; at apply time the second conflicts with the first.
    cap = request_control(store, run_id, {"max_scale": 2.0**20}, requested_by="test")
    floor = request_control(store, run_id, {"min_scale": 2.0**21}, requested_by="test")
    _wait_inbox(gs, 2)
    before = state_of(gs)
    train_step(gs, model, opt, 13)
    assert state_of(gs) == {**before, "max_scale": 2.0**20, "version": before["version"] + 1}

    # Setters called by code land in the same audit trail.
    gs.set_growth_factor(2.5)
    gs.set_backoff_factor(0.75)
    gs.set_growth_interval(6)
    train_step(gs, model, opt, 14)
    assert gs.flush(30)
    history = control_history(store, run_id)
    rows = {r["step"]: r for r in step_rows(store, run_id)}
    state = control_state(store, run_id)
    gs.close()
    store.close()

    by_id = {row.id: row for row in history}
    assert by_id[lower.id].status == "applied" and by_id[lower.id].applied_step == 11
    assert (rows[10]["growth_interval"], rows[10]["growth_factor"]) == (1000, 2.0)
    assert (rows[11]["growth_interval"], rows[11]["growth_factor"]) == (4, 3.0)
    assert rows[12]["scale_after"] == INIT * 3.0
    assert by_id[cap.id].status == "applied" and by_id[cap.id].applied_step == 13
    assert by_id[floor.id].status == "rejected" and by_id[floor.id].applied_step == 13
    assert "min_scale" in (by_id[floor.id].reason or "")
    code = [row for row in history if row.source == "code"]
    assert [row.values for row in code] == [
        {"growth_factor": 2.5},
        {"backoff_factor": 0.75},
        {"growth_interval": 6},
    ]
    assert all(row.status == "applied" and row.applied_step == 14 for row in code)
    assert (rows[14]["growth_factor"], rows[14]["backoff_factor"]) == (2.5, 0.75)
    assert rows[14]["growth_interval"] == 6
    assert state["growth_interval"] == 6 and state["version"] == rows[14]["control_version"]


# ------------------------------------------------------------ validation

NAN, INF = math.nan, math.inf
# Each request breaks one rule; the field named in the refusal. The run in effect has
# min_scale 16 and max_scale 2**20.
BAD: list[tuple[dict[str, Any], str]] = [
    ({"growth_interval": 0}, "growth_interval"),
    ({"growth_interval": -1}, "growth_interval"),
    ({"growth_interval": 2.5}, "growth_interval"),
    ({"growth_interval": 2**31}, "growth_interval"),
    ({"growth_interval": True}, "growth_interval"),
    ({"growth_interval": "5"}, "growth_interval"),
    ({"growth_factor": 1}, "growth_factor"),
    ({"growth_factor": 0.5}, "growth_factor"),
    ({"growth_factor": NAN}, "growth_factor"),
    ({"growth_factor": INF}, "growth_factor"),
    ({"backoff_factor": 0}, "backoff_factor"),
    ({"backoff_factor": 1}, "backoff_factor"),
    ({"backoff_factor": -0.1}, "backoff_factor"),
    ({"scale": 0}, "scale"),
    ({"scale": -1}, "scale"),
    ({"scale": INF}, "scale"),
    ({"scale": NAN}, "scale"),
    ({"min_scale": 64.0, "max_scale": 32.0}, "min_scale"),
    ({"min_scale": 2.0**21}, "min_scale"),
    ({"max_scale": 8.0}, "max_scale"),
    ({"hysteresis": 0}, "hysteresis"),
    ({}, "request"),
    ({"growth_intervall": 5}, "growth_intervall"),
]
IN_EFFECT = {
    "growth_interval": 3,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "min_scale": 16.0,
    "max_scale": 2.0**20,
    "hysteresis": None,
}


def _ids(case: tuple[dict[str, Any], str]) -> str:
    return repr(case[0])


@pytest.mark.heavy
@pytest.mark.parametrize("case", BAD, ids=[_ids(c) for c in BAD])
def test_store_refuses_and_records_nothing(
    tmp_path: Path, case: tuple[dict[str, Any], str]
) -> None:
    values, field = case
    with open_store(db_url(tmp_path / "sw.db")) as store:
        run = create_run(store, name="r", world_size=1, config={}, control=IN_EFFECT)
        with pytest.raises(ControlValidationError) as refused:
            request_control(store, run.id, values, requested_by="test")
        assert field in refused.value.errors
        assert control_history(store, run.id) == []
        assert control_state(store, run.id) == {**IN_EFFECT, "version": 0}


def test_store_refuses_a_finished_run(tmp_path: Path) -> None:
    with open_store(db_url(tmp_path / "sw.db")) as store:
        run = create_run(store, name="r", world_size=1, config={}, control=IN_EFFECT)
        end_run(store, run.id)
        with pytest.raises(RunNotRunning):
            request_control(store, run.id, {"growth_interval": 5}, requested_by="test")
        assert control_history(store, run.id) == []


@pytest.mark.heavy
def test_requests_past_the_store_validation_are_refused_and_nothing_changes(
    tmp_path: Path,
) -> None:
    """Requests written to the table without the store's validation are refused: the
    reporting rank's poller settles those that break a rule on their own, and the scaler
    those that conflict with the values in effect; nothing changes either way."""
    url = db_url(tmp_path / "sw.db")
    model, twin = mlp(), mlp()
    opt, twin_opt = sgd(model)[0], sgd(twin)[0]
    kwargs = {"init_scale": 2.0**8, "growth_interval": 3}
    gs = scalewatch.GradScaler("cpu", min_scale=16.0, max_scale=2.0**20, telemetry=url, **kwargs)
    reference = torch.amp.GradScaler("cpu", **kwargs)
    train_step(gs, model, opt, 1)
    train_step(reference, twin, twin_opt, 1)
    assert gs.flush(30)
    store = open_store(url)
    run_id = gs.run_id
    before = state_of(gs)
    assert {k: v for k, v in before.items() if k != "version"} == IN_EFFECT
    ids = []
    for step, (values, _) in enumerate(BAD, start=2):
        with store.write() as conn:
            inserted = conn.execute(
                control_requests.insert().values(
                    run_id=run_id,
                    values=values,
                    source="api",
                    requested_by="elsewhere",
                    requested_at=time.time(),
                    status="pending",
                )
            )
        request_id = inserted.inserted_primary_key[0]
        ids.append(request_id)
        wait_for(
            lambda request_id=request_id: (
                bool(gs._inbox) or _status(store, request_id) == "rejected"
            ),
            10,
            f"request {request_id} picked up",
        )
        train_step(gs, model, opt, step)
        train_step(reference, twin, twin_opt, step)
        assert not gs._inbox
        assert state_of(gs) == before, values
        assert gs.get_scale() == reference.get_scale(), values
    assert gs.flush(30)
    history = {row.id: row for row in control_history(store, run_id)}
    gs.close()
    store.close()
    for request_id, (values, field) in zip(ids, BAD, strict=True):
        row = history[request_id]
        assert row.status == "rejected", values
        reason = row.reason or ""
        assert field in reason or (field == "request" and reason), (values, reason)
