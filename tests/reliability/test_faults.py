"""Processes that die, a service that restarts, two jobs on one store, a slow rank.

Real trainer processes, a real ``scalewatch serve`` on 127.0.0.1 and real files; every
wait has a deadline and every process is ended by the test that started it.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from sqlalchemy import select

from scalewatch.store import open_store
from scalewatch.store.control import control_history, request_control
from scalewatch.store.runs import HEARTBEAT_TIMEOUT_S
from scalewatch.store.schema import runs, steps
from tests._helpers.faults import (
    TOKEN,
    Service,
    alarms,
    integrity,
    killable_context,
    killable_trainer,
    process_gone,
    read_steps,
    record_figures,
    service,
    start_trainer,
)
from tests._helpers.processes import end_process
from tests._helpers.ranks import Ranks
from tests._helpers.stored import db_url
from tests._helpers.waiting import wait_for

# ------------------------------------------------------------ SIGKILL at random steps

KILLS = 10
KILL_STEPS = (250, 500)  # a trainer is killed once it has printed a step in this range
KILL_PERIOD = 0.004  # s per step


def stored_steps(db: Path, name: str) -> set[int]:
    with sqlite3.connect(db, timeout=30) as conn:
        rows = conn.execute(
            "SELECT step FROM steps JOIN runs ON runs.id = steps.run_id WHERE runs.name = ?",
            (name,),
        ).fetchall()
    conn.close()
    return {row[0] for row in rows}


@pytest.mark.slow
def test_sigkill_at_random_steps_leaves_an_intact_store_and_runs_that_read_crashed(
    tmp_path: Path,
) -> None:
    rng = random.Random(8)
    db = tmp_path / "killed.db"
    url = db_url(db)
    ctx = killable_context()
    kills: list[dict[str, Any]] = []
    with service(url, tmp_path) as served:
        served.wait_healthy()
        for pair in range(KILLS // 2):
            trainers = []
            for k in (2 * pair, 2 * pair + 1):
                out = tmp_path / f"kill-{k}.out"
                proc = ctx.Process(
                    target=killable_trainer,
                    args=(url, f"kill-{k}", str(out), KILL_PERIOD),
                    daemon=True,
                )
                proc.start()
                trainers.append({"k": k, "proc": proc, "out": out, "at": rng.randint(*KILL_STEPS)})
            try:
                alive = list(trainers)

                def kill_due(alive: list[dict[str, Any]] = alive) -> bool:
                    for trainer in list(alive):
                        if trainer["proc"].exitcode is not None:
                            raise RuntimeError(f"trainer {trainer['k']} exited by itself")
                        if len(read_steps(trainer["out"])) >= trainer["at"]:
                            trainer["killed_at"] = time.time()
                            trainer["proc"].kill()
                            alive.remove(trainer)
                    return not alive

                wait_for(kill_due, 90, "the trainers to reach their kill steps")
            finally:
                for trainer in trainers:
                    trainer["proc"].kill()
                    trainer["proc"].join(10)
            # A killed trainer's writer process writes what reached it, then exits.
            writers = [int(Path(f"{t['out']}.writer").read_text()) for t in trainers]
            wait_for(
                lambda writers=writers: all(process_gone(pid) for pid in writers),
                60,
                "the killed trainers' writer processes to write what they had and exit",
            )
            check = integrity(db)
            for trainer in trainers:
                lines = read_steps(trainer["out"])
                stored = stored_steps(db, f"kill-{trainer['k']}")
                old = {line.step for line in lines if line.wall_time < trainer["killed_at"] - 1.0}
                newest = max((line.wall_time for line in lines if line.step in stored), default=0)
                kills.append(
                    {
                        "killed_at": trainer["killed_at"],
                        "exitcode": trainer["proc"].exitcode,
                        "integrity": check,
                        "printed": len(lines),
                        "old": len(old),
                        "old_lost": len(old - stored),
                        "stored": len(stored),
                        "newest_stored_age_s": trainer["killed_at"] - newest,
                    }
                )
        last_kill = max(k["killed_at"] for k in kills)

        def all_crashed() -> list[dict[str, Any]] | None:
            status, body = served.get("/api/runs")
            assert status == 200, body
            crashed = [run for run in body["runs"] if run["status"] == "crashed"]
            return body["runs"] if len(crashed) == KILLS else None

        listed = wait_for(all_crashed, HEARTBEAT_TIMEOUT_S + 45, "every killed run to read crashed")
        crashed_after_s = time.time() - last_kill

    assert [k["exitcode"] for k in kills] == [-9] * KILLS
    assert all(k["integrity"] == [("ok",)] for k in kills)
    assert [k["old_lost"] for k in kills] == [0] * KILLS
    assert sum(k["old"] for k in kills) >= KILLS * 50  # the check had steps to look at
    assert sorted(run["name"] for run in listed) == sorted(f"kill-{k}" for k in range(KILLS))
    assert all(run["steps"] > 0 for run in listed)
    record_figures(
        "sigkill",
        {
            "kills": KILLS,
            "integrity_ok": sum(k["integrity"] == [("ok",)] for k in kills),
            "steps_printed_per_kill": [k["printed"] for k in kills],
            "steps_older_than_1s_checked": sum(k["old"] for k in kills),
            "steps_older_than_1s_lost": sum(k["old_lost"] for k in kills),
            "max_age_of_newest_stored_step_s": round(
                max(k["newest_stored_age_s"] for k in kills), 3
            ),
            "median_age_of_newest_stored_step_s": round(
                median(k["newest_stored_age_s"] for k in kills), 3
            ),
            "runs_read_crashed_in_api": sum(run["status"] == "crashed" for run in listed),
            "all_crashed_after_last_kill_s": round(crashed_after_s, 1),
        },
    )


# ------------------------------------------------------------ the service killed and restarted

PERIOD = 0.005


def wait_steps(out: Path, count: int, proc: Any, what: str) -> None:
    def reached() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the trainer exited with {proc.returncode}")
        return len(read_steps(out)) >= count

    wait_for(reached, 90, what)


def run_id_of(store_url: str, name: str) -> int:
    def found() -> int | None:
        with open_store(store_url) as store, store.read() as conn:
            return conn.execute(select(runs.c.id).where(runs.c.name == name)).scalar()

    return int(wait_for(found, 60, f"the run {name}"))


def steps_of(store_url: str, run_id: int) -> list[int]:
    with open_store(store_url) as store, store.read() as conn:
        query = select(steps.c.step).where(steps.c.run_id == run_id).order_by(steps.c.step)
        return [row[0] for row in conn.execute(query)]


@pytest.mark.slow
def test_the_service_killed_and_restarted_while_training_loses_nothing(tmp_path: Path) -> None:
    url = db_url(tmp_path / "sw.db")
    stop = tmp_path / "stop"
    with service(url, tmp_path) as served:
        proc, out, err = start_trainer(url, "through-restart", tmp_path, period=PERIOD, stop=stop)
        try:
            served.wait_healthy()
            wait_steps(out, 200, proc, "200 steps")
            run_id = run_id_of(url, "through-restart")
            assert served.get(f"/api/runs/{run_id}")[0] == 200
            before_from = time.time()
            wait_for(lambda: read_steps(out)[-1].wall_time > before_from + 1.0, 30, "1 s more")
            killed_at = time.time()
            served.kill()
            with pytest.raises(OSError):
                served.get("/healthz", timeout=2)
            served.start()
            served.wait_healthy()
            back_at = time.time()
            status, detail = served.get(f"/api/runs/{run_id}")
            assert status == 200 and detail["status"] == "running"
            wait_for(lambda: read_steps(out)[-1].wall_time > back_at + 1.0, 30, "1 s more")
            stop.touch()
            returncode = proc.wait(60)
        finally:
            end_process(proc)
        lines = read_steps(out)
        last = lines[-1].step
        status, detail = served.get(f"/api/runs/{run_id}")

    assert returncode == 0 and not alarms(err.read_text()), err.read_text()
    assert [line.step for line in lines] == list(range(1, last + 1))
    assert steps_of(url, run_id) == list(range(1, last + 1))
    assert status == 200 and detail["status"] == "finished" and detail["steps"] == last
    assert detail["dropped"] == 0
    before = [line for line in lines if before_from <= line.wall_time < killed_at]
    during = [line for line in lines if killed_at <= line.wall_time < back_at]
    helped_below = len(before) / (killed_at - before_from)
    rate_during = len(during) / (back_at - killed_at)
    # The trainer is paced; a restart (a Python process importing a web stack) competes
    # for the same two cores, so the bound is loose. Blocking on the service would stop it.
    assert rate_during >= 0.5 * helped_below, (helped_below, rate_during)
    record_figures(
        "service_restart",
        {
            "outage_s": round(back_at - killed_at, 2),
            "steps_per_s_before": round(helped_below, 1),
            "steps_per_s_during_outage": round(rate_during, 1),
            "median_step_ms_before": round(median(x.work_s for x in before) * 1e3, 3),
            "median_step_ms_during": round(median(x.work_s for x in during) * 1e3, 3),
            "steps": last,
            "steps_lost": last - len(steps_of(url, run_id)),
        },
    )


# ------------------------------------------------------------ two jobs and the service


@pytest.mark.slow
def test_two_trainers_and_the_service_on_one_store_never_show_a_lock(tmp_path: Path) -> None:
    url = db_url(tmp_path / "sw.db")
    stop = tmp_path / "stop"
    names = ("job-a", "job-b")
    answers: list[tuple[str, int]] = []
    with service(url, tmp_path) as served:
        trainers = [start_trainer(url, n, tmp_path, period=0.001, stop=stop) for n in names]
        try:
            served.wait_healthy()
            for proc, out, _ in trainers:
                wait_steps(out, 100, proc, "100 steps of each job")
            ids = [run_id_of(url, name) for name in names]
            requests = [post_control(served, run_id, {"growth_interval": 7}) for run_id in ids]
            assert [r[0] for r in requests] == [202, 202], requests
            ended = time.monotonic() + 4.0
            while time.monotonic() < ended:
                for path in poll_paths(ids):
                    answers.append((path, served.get(path)[0]))
            stop.touch()
            codes = [proc.wait(60) for proc, _, _ in trainers]
        finally:
            for proc, _, _ in trainers:
                end_process(proc)
        finals = [served.get(f"/api/runs/{run_id}")[1] for run_id in ids]
        server_log = served.logs()

    assert codes == [0, 0]
    for _, _, err in trainers:
        assert not alarms(err.read_text()), err.read_text()
    assert not [a for a in answers if a[1] != 200], [a for a in answers if a[1] != 200][:5]
    assert "locked" not in server_log and "Traceback" not in server_log
    with open_store(url) as store:
        history = [control_history(store, run_id) for run_id in ids]
    for (_, out, _), run_id, final, requested in zip(trainers, ids, finals, history, strict=True):
        last = read_steps(out)[-1].step
        assert steps_of(url, run_id) == list(range(1, last + 1))
        assert final["status"] == "finished" and final["steps"] == last and final["dropped"] == 0
        assert [r.status for r in requested] == ["applied"]
    record_figures(
        "two_jobs_one_store",
        {
            "steps_per_job": [read_steps(out)[-1].step for _, out, _ in trainers],
            "api_requests_while_training": len(answers),
            "api_non_200": sum(code != 200 for _, code in answers),
            "control_requests_applied": sum(len(h) for h in history),
            "locked_messages": 0,
        },
    )


def poll_paths(ids: list[int]) -> list[str]:
    paths = ["/api/runs"]
    for run_id in ids:
        paths += [
            f"/api/runs/{run_id}",
            f"/api/runs/{run_id}/steps?max_points=200",
            f"/api/runs/{run_id}/overflows?limit=50",
            f"/api/runs/{run_id}/control",
        ]
    return paths


def post_control(served: Service, run_id: int, values: dict[str, Any]) -> tuple[int, Any]:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{served.base_url}/api/runs/{run_id}/control",
        data=json.dumps(values).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        body = error.read()
        error.close()
        return error.code, body.decode(errors="replace")


# ------------------------------------------------------------ control while a rank is slow

SLOW_AT = {1: 30, 0: 60}  # rank -> step at which it stalls until the test lets it go
CONTROL_STEPS = 90
INIT = 2.0**16


def _slow_rank(rank: int, world: int, url: str, folder: str) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import scalewatch

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gs = scalewatch.ShardedGradScaler(
        "cpu", init_scale=INIT, growth_interval=1000, telemetry=url, run_name="slow-rank"
    )
    if rank == 0:  # the reporting rank, whose control poller fills the inbox
        threading.Thread(target=_tell_when_picked_up, args=(gs, folder), daemon=True).start()
    g = torch.Generator().manual_seed(rank)
    scales: list[float] = []
    states: list[dict[str, Any]] = []
    for step in range(1, CONTROL_STEPS + 1):
        opt.zero_grad()
        loss = model(torch.randn(8, 8, generator=g)).pow(2).mean()
        gs.scale(loss).backward()
        if rank == 1 and step % 7 == 0:
            model.module[0].weight.grad.view(-1)[0] = float("inf")
        if SLOW_AT[rank] == step:
            # Stalled between backward and the scaler's all-reduce: the other rank waits in it.
            Path(folder, f"slow-{rank}").touch()
            wait_for(lambda r=rank: Path(folder, f"go-{r}").exists(), 60, "the test's go")
        gs.step(opt)
        gs.update()
        scales.append(gs.get_scale())
        states.append({**gs.control_state(), "version": gs._control_version})
        time.sleep(0.01)
    if rank == 0:
        assert gs.flush(30)
    result = {"scales": scales, "states": states, "run_id": gs.run_id}
    gs.close()
    return result


def _tell_when_picked_up(gs: Any, folder: str) -> None:
    """For each stall, in the test's order: once the test says how many requests it filed
    (``want-R``), wait until the control poller has put them in the scaler's inbox, then
    say so (``picked-R``), while the stalled rank still waits."""
    for stalled in SLOW_AT:
        want = Path(folder, f"want-{stalled}")
        wait_for(want.exists, 120, f"the test's requests for rank {stalled}'s stall")
        count = int(want.read_text())
        wait_for(lambda n=count: len(gs._inbox) >= n, 60, "the poller to pick them up")
        Path(folder, f"picked-{stalled}").touch()


def first_step_with(states: list[dict[str, Any]], key: str, value: Any) -> int:
    return next(i + 1 for i, state in enumerate(states) if state[key] == value)


@pytest.mark.slow
def test_control_during_a_stalled_rank_applies_at_one_step_on_every_rank(tmp_path: Path) -> None:
    url = db_url(tmp_path / "sw.db")
    open_store(url).close()
    requested: dict[str, int] = {}
    with Ranks(_slow_rank, 2, url, str(tmp_path)) as ranks, open_store(url) as store:
        for rank, values in (
            (1, [{"growth_interval": 5}]),
            # Valid one by one; once the cap applies the floor above it is refused.
            (0, [{"max_scale": 2.0**18}, {"min_scale": 2.0**19}]),
        ):
            marker = tmp_path / f"slow-{rank}"
            wait_for(marker.exists, 120, f"rank {rank} to stall")
            run_id = store_run_id(store)
            for value in values:
                requested[next(iter(value))] = request_control(
                    store, run_id, value, requested_by="reliability"
                ).id
            # Rank 0's poller (5 polls/s) picks the requests up while the rank is stalled.
            (tmp_path / f"want-{rank}.part").write_text(str(len(values)))
            (tmp_path / f"want-{rank}.part").rename(tmp_path / f"want-{rank}")
            picked = tmp_path / f"picked-{rank}"
            wait_for(picked.exists, 120, f"the poller to pick up rank {rank}'s requests")
            (tmp_path / f"go-{rank}").touch()
        rank0, rank1 = ranks.results(timeout=120)
        history = {row.id: row for row in control_history(store, rank0["run_id"])}

    assert rank1["scales"] == rank0["scales"] and rank1["states"] == rank0["states"]
    states = rank0["states"]
    interval = history[requested["growth_interval"]]
    assert interval.status == "applied"
    # Rank 0 was waiting in step 30's all-reduce, its payload sent: the request rides in
    # the next one. Stalled itself before its step-60 all-reduce, it sends it in that one.
    assert interval.applied_step == first_step_with(states, "growth_interval", 5)
    assert SLOW_AT[1] < interval.applied_step <= SLOW_AT[1] + 2
    cap = history[requested["max_scale"]]
    assert cap.status == "applied"
    assert cap.applied_step == first_step_with(states, "max_scale", 2.0**18)
    assert SLOW_AT[0] <= cap.applied_step <= SLOW_AT[0] + 2
    floor = history[requested["min_scale"]]
    assert floor.status == "rejected" and "min_scale" in (floor.reason or "")
    assert floor.applied_step is not None and floor.applied_step > cap.applied_step
    assert states[floor.applied_step - 1] == states[floor.applied_step - 2]  # nothing changed
    assert all(state["min_scale"] is None for state in states)
    record_figures(
        "control_stalled_rank",
        {
            "ranks": 2,
            "requests": len(requested),
            "applied_at_one_step_on_all_ranks": 2,
            "rejected_with_reason": 1,
            "applied_steps": [interval.applied_step, cap.applied_step],
            "rejected_at_step": floor.applied_step,
            "stalled_at_steps": [SLOW_AT[1], SLOW_AT[0]],
            "scale_sequences_identical": rank0["scales"] == rank1["scales"],
        },
    )


def store_run_id(store: Any) -> int:
    def found() -> int | None:
        with store.read() as conn:
            return conn.execute(select(runs.c.id)).scalar()

    return int(wait_for(found, 30, "the run"))


RESTART_AT = 40  # steps before the job goes down; at least as many again after it restarts
RESTART_CAP = 3000  # steps the restarted job trains at most, waiting for the request


def _restarting_rank(rank: int, world: int, url: str, folder: str, phase: int) -> dict[str, Any]:
    """Phase 1 trains, checkpoints and goes down without closing (as a crash does);
    phase 2 restarts from the checkpoint and goes on."""
    import json

    import torch
    from torch.nn.parallel import DistributedDataParallel

    import scalewatch

    torch.manual_seed(phase)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if phase == 2:  # started beside phase 1, to restart in seconds once it is down
        wait_for(Path(folder, "restart").exists, 180, "the job to go down")
    gs = scalewatch.ShardedGradScaler(
        "cpu", growth_interval=1000, telemetry=url, run_name="restart"
    )
    checkpoint = Path(folder, f"scaler-{rank}.json")
    if phase == 2:
        gs.load_state_dict(json.loads(checkpoint.read_text()))
    g = torch.Generator().manual_seed(100 * phase + rank)
    states: list[dict[str, Any]] = []
    scales: list[float] = []
    # Phase 2 goes on past its RESTART_AT steps until the request made while the job was
    # down shows (its writer process starts, opens the run and polls first: on a loaded
    # machine that takes seconds). Both ranks see it at one step, so both stop there; a
    # rank that saw it alone would wait in DDP's next all-reduce, and the test time out.
    while len(states) < RESTART_AT or (
        phase == 2 and states[-1]["growth_interval"] != 7 and len(states) < RESTART_CAP
    ):
        opt.zero_grad()
        gs.scale(model(torch.randn(8, 8, generator=g)).pow(2).mean()).backward()
        gs.step(opt)
        gs.update()
        scales.append(gs.get_scale())
        states.append(gs.control_state())
        time.sleep(0.02)
    result = {"run_uid": gs.run_uid, "steps": gs.steps, "scales": scales, "states": states}
    if rank == 0:
        assert gs.flush(30)
        result["run_id"] = gs.run_id
    if phase == 1:
        checkpoint.write_text(json.dumps(gs.state_dict()))
        # Gone as in a crash, where nothing closes the scaler (not even its finalizer, which
        # a dropped scaler runs): the run reads "running" until its heartbeat goes stale.
        gs._session.closer.detach()
        del gs
    else:
        gs.close()
    return result


@pytest.mark.slow
def test_control_requested_while_the_job_restarts_applies_at_one_step_on_every_rank(
    tmp_path: Path,
) -> None:
    url = db_url(tmp_path / "sw.db")
    open_store(url).close()
    # The restarted job's ranks start (processes, torch, their group) while the first job
    # trains: the restart then comes well within the heartbeat timeout, however loaded the
    # machine is.
    with (
        Ranks(_restarting_rank, 2, url, str(tmp_path), 2) as restarted,
        open_store(url) as store,
    ):
        with Ranks(_restarting_rank, 2, url, str(tmp_path), 1) as ranks:
            before = ranks.results(timeout=120)
        run_id = before[0]["run_id"]
        # The job is down; its run has not timed out yet, so the request waits as pending.
        request = request_control(store, run_id, {"growth_interval": 7}, requested_by="test")
        Path(tmp_path, "restart").touch()
        after = restarted.results(timeout=180)
        row = {r.id: r for r in control_history(store, run_id)}[request.id]
        with store.read() as conn:
            stored = [
                s for (s,) in conn.execute(select(steps.c.step).where(steps.c.run_id == run_id))
            ]
            (status,) = conn.execute(select(runs.c.status).where(runs.c.id == run_id)).one()
    assert after[0]["run_id"] == run_id and after[0]["run_uid"] == before[0]["run_uid"]
    (trained,) = {r["steps"] for r in after}  # one count, both ranks
    assert 2 * RESTART_AT <= trained < RESTART_AT + RESTART_CAP
    assert sorted(stored) == list(range(1, trained + 1))
    assert status == "finished"
    assert row.status == "applied", row
    applied = [RESTART_AT + first_step_with(r["states"], "growth_interval", 7) for r in after]
    assert applied == [row.applied_step] * 2
    assert after[0]["scales"] == after[1]["scales"]
    assert after[0]["states"] == after[1]["states"]
    record_figures(
        "control_restarting_job",
        {"ranks": 2, "down_at_step": RESTART_AT, "applied_at_step": row.applied_step},
    )
