"""Telemetry into the store: one row per step as torch's scaler sees it, and a store that fails.

The multi-process and kill tests run real processes on 127.0.0.1 and end by themselves.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import create_engine, event, select, text
from sqlalchemy.exc import DBAPIError
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch
from scalewatch._control import ControlOutcome, ControlSource
from scalewatch._control.inbox import ControlInbox
from scalewatch.store import Store, open_store
from scalewatch.store import runs as store_runs
from scalewatch.store.runs import HEARTBEAT_TIMEOUT_S, effective_status
from scalewatch.store.schema import runs, steps, telemetry_gaps
from scalewatch.telemetry import Telemetry, TelemetrySettings
from scalewatch.telemetry._writer import one_line
from tests._helpers.faults import process_gone
from tests._helpers.ranks import run_ranks
from tests._helpers.stored import db_url, step_rows
from tests._helpers.twin import INJECT, batch, mlp, poison, sgd, train, train_step
from tests._helpers.waiting import wait_for
from tests.scaler.test_sync_count import DIAGNOSIS_READS, counting_host_reads
from tests.scaler.test_writer import sample

ROOT = Path(__file__).resolve().parents[2]


def run_rows(store: Store) -> list[dict[str, Any]]:
    with store.read() as conn:
        return [dict(row._mapping) for row in conn.execute(select(runs).order_by(runs.c.id))]


# ------------------------------------------------------------ 2-rank FSDP2, side by side

FSDP_STEPS = 14
FSDP_INJECT = (4, 8, 9)  # steps (1-based update() count) with inf in rank 1's shard
FSDP_INIT = 2.0**10


def _fsdp_twin(rank: int, world: int, url: str) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def sharded() -> nn.Module:
        model = mlp(seed=0)
        fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))
        return model

    kwargs = {"device": "cpu", "init_scale": FSDP_INIT, "growth_interval": 3}
    ours = scalewatch.ShardedGradScaler(**kwargs, telemetry=url, run_name="fsdp2")
    theirs = TorchSharded(**kwargs)
    pairs = [(gs, sharded()) for gs in (ours, theirs)]
    pairs = [(gs, model, sgd(model)[0]) for gs, model in pairs]
    scales: dict[str, list[float]] = {"ours": [], "torch": []}
    for step in range(1, FSDP_STEPS + 1):
        for gs, model, opt in pairs:
            opt.zero_grad()
            loss = model(batch(step * world + rank)).float().pow(2).mean()
            gs.scale(loss).backward()
            if rank == 1 and step in FSDP_INJECT:
                grad = next(iter(model.parameters())).grad
                assert grad is not None
                grad._local_tensor.view(-1)[0] = float("inf")  # type: ignore[attr-defined]
            gs.step(opt)
            gs.update()
        scales["ours"].append(ours.get_scale())
        scales["torch"].append(theirs.get_scale())
    params_equal = all(
        torch.equal(a._local_tensor, b._local_tensor)  # type: ignore[attr-defined]
        for a, b in zip(pairs[0][1].parameters(), pairs[1][1].parameters(), strict=True)
    )
    if ours._session.telemetry is not None:
        assert ours.flush(30)
    db_name = url.rsplit("/", 1)[-1]
    # The store is open in this rank's process or in its telemetry's writer process.
    writer_pid = getattr(ours._session.telemetry, "writer_pid", None)
    store_fds = [
        fd
        for pid in ("self", writer_pid)
        if pid is not None
        for fd in os.listdir(f"/proc/{pid}/fd")
        if db_name in (os.readlink(f"/proc/{pid}/fd/{fd}") if _is_link(pid, fd) else "")
    ]
    result = {
        "scales": scales,
        "params_equal": params_equal,
        "telemetry_none": ours._session.telemetry is None,
        "store_open": bool(store_fds),
        "run_id": ours.run_id,
        "steps": ours.steps,
    }
    ours.close()
    return result


def _is_link(pid: str | int, fd: str) -> bool:
    return os.path.islink(f"/proc/{pid}/fd/{fd}")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_two_rank_fsdp2_rows_match_torchs_sharded_scaler(tmp_path: Path) -> None:
    url = db_url(tmp_path / "fsdp2.db")
    rank0, rank1 = run_ranks(_fsdp_twin, 2, url, timeout=150)

    for rank in (rank0, rank1):
        assert rank["scales"]["ours"] == rank["scales"]["torch"]
        assert rank["params_equal"]
        assert rank["steps"] == FSDP_STEPS
    torch_scales = rank0["scales"]["torch"]
    assert rank1["scales"]["torch"] == torch_scales
    # Only the reporting rank opened the store.
    assert not rank0["telemetry_none"] and rank0["store_open"]
    assert rank1["telemetry_none"] and not rank1["store_open"] and rank1["run_id"] is None

    with open_store(url) as store:
        (run,) = run_rows(store)
        rows = step_rows(store)
    assert run["id"] == rank0["run_id"] and run["world_size"] == 2
    assert run["status"] == "finished" and run["dropped"] == 0
    assert [r["step"] for r in rows] == list(range(1, FSDP_STEPS + 1))
    assert [r["step"] for r in rows if r["overflow"]] == list(FSDP_INJECT)
    assert [r["step"] for r in rows if r["skipped"]] == list(FSDP_INJECT)
    assert [r["inf_ranks"] for r in rows] == ["1" if r["overflow"] else "" for r in rows]
    assert [r["scale_after"] for r in rows] == torch_scales
    assert [r["scale"] for r in rows] == [FSDP_INIT, *torch_scales[:-1]]
    assert len(set(torch_scales)) > 2  # the run grew and backed off


# ------------------------------------------------------------ one process, each device


def test_rows_match_torchs_scaler_on_each_device(kind: str, device: str, tmp_path: Path) -> None:
    """On cuda the values reach the store through pinned host memory, off the training thread."""
    url = db_url(tmp_path / "sw.db")
    kwargs: dict[str, Any] = {"device": device, "init_scale": 2.0**10, "growth_interval": 2}
    if kind == "plain":
        theirs, ours = (
            torch.amp.GradScaler(**kwargs),
            scalewatch.GradScaler(**kwargs, telemetry=url),
        )
    else:
        theirs, ours = TorchSharded(**kwargs), scalewatch.ShardedGradScaler(**kwargs, telemetry=url)
    traces = []
    for gs in (theirs, ours):
        model = mlp().to(device)
        traces.append(train(gs, model, sgd(model), steps=12, inject=INJECT))
    traces[1].assert_same(traces[0])
    assert ours.flush(30)
    run_id = ours.run_id
    ours.close()
    with open_store(url) as store:
        rows = step_rows(store, run_id)
    scales = traces[0].scales
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["overflow"] for r in rows] == [s in INJECT for s in range(12)]
    assert [r["skipped"] for r in rows] == traces[0].skipped
    assert [r["scale_after"] for r in rows] == scales
    assert [r["scale"] for r in rows] == [2.0**10, *scales[:-1]]
    assert [r["growth_tracker"] for r in rows] == traces[0].trackers
    assert len(set(scales)) > 2  # the run grew and backed off


# ------------------------------------------------------------ kill -9 mid-run

TRAINER = """
import sys, time, torch, scalewatch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gs = scalewatch.GradScaler("cpu", growth_interval=50, telemetry=sys.argv[1], run_name="killed")
step = 0
while True:
    opt.zero_grad()
    gs.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
    gs.step(opt)
    gs.update()
    step += 1
    if step == 1:  # the run opens at the first step, and its writer process with it
        print("writer", gs._session.telemetry.writer_pid, flush=True)
    print(step, repr(time.time()), flush=True)
    time.sleep(0.002)
"""


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(url: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
        proc = subprocess.Popen(
            [sys.executable, "-c", TRAINER, url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.mark.slow
def test_kill_9_leaves_an_intact_store_with_every_step_older_than_a_second(
    tmp_path: Path, trainer: Callable[[str], subprocess.Popen[str]]
) -> None:
    db = tmp_path / "killed.db"
    proc = trainer(db_url(db))
    lines = _lines(proc)
    done: dict[int, float] = {}
    writer: list[int] = []

    def progressed() -> bool:
        while not lines.empty():
            first, second = lines.get().split()
            if first == "writer":
                writer.append(int(second))
            else:
                done[int(first)] = float(second)
        return len(done) >= 300 and max(done.values()) - min(done.values()) >= 2.5

    wait_for(progressed, 90, "the trainer to run 300 steps over 2.5 s")
    killed_at = time.time()
    proc.kill()
    proc.wait(10)
    # The writer process outlives the kill: it writes what reached it, then exits when its
    # socket ends (on a loaded machine it may still be opening the run at the kill).
    (writer_pid,) = writer
    wait_for(lambda: process_gone(writer_pid), 60, "the killed trainer's writer process to exit")

    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    with open_store(db_url(db)) as store:
        (run,) = run_rows(store)
        stored = {r["step"] for r in step_rows(store)}
    old = {step for step, at in done.items() if at < killed_at - 1.0}
    assert len(old) >= 100
    assert old <= stored
    # Nobody marked it: the run reads as crashed once its heartbeat is stale.
    assert run["status"] == "running"
    beat = run["heartbeat_at"]
    assert effective_status(run, now=beat + 1.0) == "running"
    assert effective_status(run, now=beat + HEARTBEAT_TIMEOUT_S + 1.0) == "crashed"


# ------------------------------------------------------------ single process


def test_close_marks_finished_and_a_finished_run_never_reads_as_crashed(tmp_path: Path) -> None:
    url = db_url(tmp_path / "sw.db")
    model = mlp()
    opt = sgd(model)[0]
    with scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url, run_name="closed") as gs:
        for step in range(1, 6):
            train_step(gs, model, opt, step)
        assert gs.flush(30)
        run_id = gs.run_id
    with open_store(url) as store:
        (run,) = run_rows(store)
        assert len(step_rows(store)) == 5
    assert run["id"] == run_id and run["name"] == "closed"
    assert run["status"] == "finished" and run["ended_at"] is not None
    assert effective_status(run, now=run["heartbeat_at"] + 10 * HEARTBEAT_TIMEOUT_S) == "finished"
    gs.close()  # twice is fine


def test_a_run_starts_at_or_before_its_first_step(kind: str, tmp_path: Path) -> None:
    """The run row is written after the first steps were taken; it still starts before them."""
    url = db_url(tmp_path / "sw.db")
    cls = scalewatch.GradScaler if kind == "plain" else scalewatch.ShardedGradScaler
    model = mlp()
    opt = sgd(model)[0]
    with cls("cpu", growth_interval=2, telemetry=url) as gs:
        for step in range(1, 6):
            train_step(gs, model, opt, step)
        assert gs.flush(30)
    with open_store(url) as store:
        (run,) = run_rows(store)
        first = min(row["wall_time"] for row in step_rows(store))
    assert run["started_at"] <= first


def test_step_writes_keep_the_heartbeat_and_an_idle_run_beats_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of steps sets the heartbeat in its own transaction: no second one beside it."""
    interval = 1.0
    beats: list[float] = []
    real_heartbeat = store_runs.heartbeat

    def counted(store: Store, run_id: int, at: float | None = None) -> None:
        beats.append(time.time())
        real_heartbeat(store, run_id, at)

    monkeypatch.setattr(store_runs, "heartbeat", counted)
    url = db_url(tmp_path / "sw.db")
    model = mlp()
    opt = sgd(model)[0]
    with scalewatch.GradScaler(
        "cpu", telemetry=TelemetrySettings(url, heartbeat_s=interval, writer="thread")
    ) as gs:
        began = time.time()
        step = 0
        while time.time() < began + 2.5 * interval:  # steps all along: a write every 0.2 s
            step += 1
            train_step(gs, model, opt, step)
        assert gs.flush(30)
        with open_store(url) as store:
            (run,) = run_rows(store)
        assert beats == []
        assert run["heartbeat_at"] >= began + 2.0 * interval
        stopped = time.time()
        wait_for(lambda: [at for at in beats if at > stopped], 10 * interval, "an idle heartbeat")
        with open_store(url) as store:
            (run,) = run_rows(store)
        assert run["heartbeat_at"] > stopped


def test_resume_continues_the_run_and_a_torch_dict_starts_a_new_one(tmp_path: Path) -> None:
    url = db_url(tmp_path / "sw.db")
    model = mlp()
    opt = sgd(model)[0]
    first = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    for step in range(1, 5):
        train_step(first, model, opt, step)
    state = first.state_dict()
    assert first.flush(30)
    run_id = first.run_id
    first.close()

    second = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    second.load_state_dict(state)
    for step in range(5, 8):
        train_step(second, model, opt, step)
    assert second.flush(30)
    assert second.run_id == run_id and second.steps == 7
    second.close()

    fresh = scalewatch.GradScaler("cpu", growth_interval=2, telemetry=url)
    fresh.load_state_dict(torch.amp.GradScaler("cpu", growth_interval=2).state_dict())
    for step in range(1, 3):
        train_step(fresh, model, opt, step)
    assert fresh.flush(30)
    new_id = fresh.run_id
    fresh.close()

    with open_store(url) as store:
        resumed = step_rows(store, run_id)
        other = step_rows(store, new_id)
        all_runs = run_rows(store)
    assert new_id != run_id and len(all_runs) == 2
    assert all(run["status"] == "finished" for run in all_runs)
    assert [r["step"] for r in resumed] == list(range(1, 8))
    # The resumed steps start from the scale the checkpoint held.
    assert [r["scale"] for r in resumed[1:]] == [r["scale_after"] for r in resumed[:-1]]
    assert [r["step"] for r in other] == [1, 2]


def test_a_locked_store_never_stops_training_and_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "sw.db"
    model = mlp()
    opt = sgd(model)[0]
    gs = scalewatch.GradScaler("cpu", growth_interval=50, telemetry=db_url(db))
    for step in range(1, 6):
        train_step(gs, model, opt, step)
    assert gs.flush(30)

    blocker = sqlite3.connect(db, timeout=10, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        slowest = 0.0
        step = 5
        while time.monotonic() - started < 3.0:
            before = time.monotonic()
            step += 1
            train_step(gs, model, opt, step)
            slowest = max(slowest, time.monotonic() - before)
        locked_steps = step - 5
        with sqlite3.connect(db) as reader:  # WAL: readers see the last commit
            (written,) = reader.execute("SELECT count(*) FROM steps").fetchone()
        assert written == 5
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    for _ in range(5):
        step += 1
        train_step(gs, model, opt, step)
    assert gs.flush(30)
    dropped = gs._session.telemetry.dropped
    gs.close()

    assert locked_steps >= 30 and slowest < 1.0  # training went on while the store was locked
    with open_store(db_url(db)) as store:
        assert [r["step"] for r in step_rows(store)] == list(range(1, step + 1))
        (run,) = run_rows(store)
    assert dropped == 0 and run["dropped"] == 0


def _read_only(store: Store) -> Callable[[bool], None]:
    """Switch every connection of ``store`` to SQLite's read-only mode and back.

    Works whoever runs the tests (root ignores a chmod 0444), and fails writes with the
    same error as a read-only file: "attempt to write a readonly database".
    """
    state = {"on": False}

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        if state["on"]:
            dbapi_connection.execute("PRAGMA query_only = ON")

    event.listen(store.engine, "connect", on_connect)

    def switch(on: bool) -> None:
        state["on"] = on
        store.engine.dispose()

    return switch


def test_the_store_failing_is_one_line_with_the_reason_and_no_sql(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLAlchemy's message carries the statement and its parameters over several lines."""
    caplog.set_level(logging.WARNING, logger="scalewatch.telemetry")
    store = open_store(db_url(tmp_path / "sw.db"))
    _read_only(store)(True)
    settings = TelemetrySettings(store, retry_s=0.05)
    telemetry = Telemetry(
        settings, name=None, world_size=1, config={}, control={}, inbox=ControlInbox()
    )
    try:
        telemetry.submit([sample(1)])
        wait_for(lambda: telemetry.failing is not None, 30, "the writer to find the store failing")
    finally:
        telemetry.close(timeout=1.0)
        store.close()
    (warning,) = [r.getMessage() for r in caplog.records if "not taking writes (" in r.getMessage()]
    reason = "OperationalError: attempt to write a readonly database"
    assert warning == (
        f"scalewatch: the store is not taking writes ({reason}); records wait, then are dropped"
    )
    assert telemetry.failing == reason  # also the reason a gap is recorded with


def test_one_line_keeps_the_drivers_message_without_the_statement_or_its_values() -> None:
    engine = create_engine("sqlite://")
    with pytest.raises(DBAPIError) as raised, engine.connect() as conn:
        conn.execute(text("INSERT INTO nowhere VALUES (:secret)"), {"secret": "hunter2"})
    engine.dispose()
    assert "hunter2" in str(raised.value) and "[SQL" in str(raised.value)
    assert one_line(raised.value) == "OperationalError: no such table: nowhere"
    assert one_line(OSError("disk I/O error\nmore")) == "OSError: disk I/O error"
    assert one_line(RuntimeError()) == "RuntimeError: no message"


@pytest.mark.parametrize("fault", ["read-only", "directory-removed"])
def test_an_unwritable_store_drops_past_the_bound_and_records_the_gap(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="scalewatch.telemetry")
    folder = tmp_path / "store"
    folder.mkdir()
    url = db_url(folder / "sw.db")
    store = open_store(url)
    model = mlp()
    opt = sgd(model)[0]
    step = 0
    if fault == "read-only":
        settings = TelemetrySettings(store, max_pending=16)
        gs = scalewatch.GradScaler("cpu", growth_interval=50, telemetry=settings)
        for step in range(1, 6):
            train_step(gs, model, opt, step)
        assert gs.flush(30)
        switch = _read_only(store)
        switch(True)
    else:
        # The store's directory is gone when the writer first opens it.
        settings = TelemetrySettings(url, max_pending=16, writer="thread")
        gs = scalewatch.GradScaler("cpu", growth_interval=50, telemetry=settings)
        store.close()
        folder.rename(tmp_path / "elsewhere")
    steps_before_fault = step

    def dropping() -> bool:
        nonlocal step
        step += 1
        train_step(gs, model, opt, step)
        return gs._session.telemetry is not None and gs._session.telemetry.dropped >= 40

    wait_for(dropping, 60, "records to be dropped past the queue bound")
    telemetry = gs._session.telemetry
    assert telemetry is not None
    if fault == "read-only":
        switch(False)
    else:
        (tmp_path / "elsewhere").rename(folder)
    for _ in range(5):
        step += 1
        train_step(gs, model, opt, step)
    assert gs.flush(30)
    dropped = telemetry.dropped
    assert gs.stats().dropped_records == dropped
    run_id = gs.run_id
    gs.close()
    assert gs.stats().dropped_records == dropped  # kept past close()
    store.close()

    warnings = [r for r in caplog.records if "not taking writes" in r.getMessage()]
    assert len(warnings) == 1
    assert step - steps_before_fault > 40  # training went on
    with open_store(url) as reader:
        stored = [r["step"] for r in step_rows(reader, run_id)]
        (run,) = run_rows(reader)
        with reader.read() as conn:
            gaps = [dict(g._mapping) for g in conn.execute(select(telemetry_gaps))]
    (gap,) = gaps
    assert gap["run_id"] == run_id and gap["dropped"] == dropped == run["dropped"]
    lost = set(range(gap["first_step"], gap["last_step"] + 1))
    assert len(lost) == dropped
    assert sorted(set(stored) | lost) == list(range(1, step + 1))
    assert not lost & set(stored)
    assert gap["reason"]


@pytest.mark.parametrize(
    "bad",
    [
        {"max_pending": 0},
        {"batch": 2.5},
        {"batch": True},
        {"coalesce_s": -1.0},
        {"retry_s": math.nan},
        {"close_failing_s": "5"},
        {"send_interval_s": -0.5},
    ],
    ids=repr,
)
def test_settings_refuse_values_the_writer_cannot_run_with(bad: dict[str, Any]) -> None:
    (name,) = bad
    with pytest.raises(ValueError, match=f"^{name} must be "):
        TelemetrySettings(**bad)


def test_settings_are_per_writer_not_per_process(tmp_path: Path) -> None:
    """Two writers of one process, each with its own bound: the tunables are arguments."""
    small = TelemetrySettings(db_url(tmp_path / "missing" / "a.db"), max_pending=3)
    large = TelemetrySettings(db_url(tmp_path / "missing" / "b.db"), max_pending=8)
    made = [
        Telemetry(settings, name=None, world_size=1, config={}, control={}, inbox=ControlInbox())
        for settings in (small, large)
    ]
    try:
        for telemetry in made:
            telemetry.submit([sample(step) for step in range(1, 11)])
        assert [telemetry.dropped for telemetry in made] == [7, 2]
    finally:
        for telemetry in made:
            telemetry.close(timeout=1.0)


def test_a_control_outcome_says_where_it_came_from() -> None:
    code = ControlOutcome(
        source=ControlSource.CODE,
        request_id=None,
        values={"growth_factor": 3.0},
        applied=True,
        reason=None,
        state={},
        version=1,
    )
    request = ControlOutcome(
        source=ControlSource.REQUEST,
        request_id=7,
        values={"scale": 8.0},
        applied=False,
        reason="no",
        state={},
        version=1,
    )
    assert (code.source, code.request_id, str(code.source)) == (ControlSource.CODE, None, "code")
    assert (request.source, request.request_id) == (ControlSource.REQUEST, 7)
    with pytest.raises(ValueError, match="code change has request_id 0"):
        ControlOutcome(
            source=ControlSource.CODE,
            request_id=0,
            values={"scale": 8.0},
            applied=True,
            reason=None,
            state={},
            version=1,
        )
    with pytest.raises(ValueError, match="request change has request_id None"):
        ControlOutcome(
            source=ControlSource.REQUEST,
            request_id=None,
            values={"scale": 8.0},
            applied=True,
            reason=None,
            state={},
            version=1,
        )


# ------------------------------------------------------------ host-device syncs


def test_telemetry_adds_no_sync_to_a_training_step(kind: str, tmp_path: Path) -> None:
    url = db_url(tmp_path / "sw.db")
    kwargs = {"device": "cpu", "growth_interval": 3}
    if kind == "plain":
        pair = [torch.amp.GradScaler(**kwargs), scalewatch.GradScaler(**kwargs, telemetry=url)]
    else:
        pair = [TorchSharded(**kwargs), scalewatch.ShardedGradScaler(**kwargs, telemetry=url)]
    syncs, overflow_syncs = [], []
    for gs in pair:
        model = mlp()
        opt = sgd(model)[0]
        clean, overflow = 0, 0
        for step in range(1, 13):
            with counting_host_reads() as counts:
                opt.zero_grad()
                gs.scale(model(batch(step)).pow(2).mean()).backward()
                if step in (3, 7):
                    poison(list(model.parameters()), 0, float("inf"))
                gs.step(opt)
                gs.update()
            if step in (3, 7):
                overflow += sum(counts.values())
            else:
                clean += sum(counts.values())
        syncs.append(clean)
        overflow_syncs.append(overflow)
    ours = pair[1]
    assert ours._session.telemetry is not None  # the store was really on
    ours.close()
    assert syncs[1] <= syncs[0]
    # an overflow step is explained: the diagnosis reads what it found (test_sync_count)
    assert overflow_syncs[1] <= overflow_syncs[0] + 2 * DIAGNOSIS_READS


def test_store_directory_removed_mid_run_is_noticed_and_recovered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite would write on into the unlinked file; the writer notices, waits, starts over."""
    directory = tmp_path / "store"
    directory.mkdir()
    url = f"sqlite:///{directory / 'sw.db'}"
    model = mlp()
    opt = sgd(model)[0]
    settings = TelemetrySettings(url, writer="thread")  # its warnings in this process's log
    gs = scalewatch.GradScaler("cpu", telemetry=settings, run_name="moved")

    def train(first: int, count: int) -> None:
        for step in range(first, first + count):
            opt.zero_grad()
            gs.scale(model(batch(step)).pow(2).mean()).backward()
            gs.step(opt)
            gs.update()

    caplog.set_level(logging.WARNING, logger="scalewatch.telemetry")
    train(0, 20)
    assert gs.flush(30)
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    train(20, 30)
    wait_for(
        lambda: any("not taking writes" in r.getMessage() for r in caplog.records),
        10,
        "a warning that the store is gone",
    )
    directory.mkdir()
    train(50, 10)
    assert gs.flush(30)
    gs.close()
    with open_store(url) as store, store.read() as conn:
        stored = [row[0] for row in conn.execute(select(steps.c.step).order_by(steps.c.step))]
        (status,) = conn.execute(select(runs.c.status)).one()
    # the steps written before the removal went with the old file; none after it are lost
    assert stored == list(range(21, 61))
    assert status == "finished"
    assert sum("not taking writes" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("max_pending", 0, "max_pending must be an integer >= 1"),
        ("batch", True, "batch must be an integer >= 1"),
        ("coalesce_s", -1.0, "coalesce_s must be a number of seconds >= 0"),
        ("heartbeat_s", 0.0, "heartbeat_s must be a number of seconds > 0 and < 15"),
        ("heartbeat_s", 15.0, "heartbeat_s must be a number of seconds > 0 and < 15"),
    ],
)
def test_settings_refuse_what_would_break_the_writer(field: str, value: Any, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        TelemetrySettings(**{field: value})
