"""The spool: while the service cannot be reached, a job's batches wait on the node, and
reach the service later in their order: sent by the next scalewatch process on the node
after the job was killed, or by ``scalewatch spool send``; past the spool's bound, the
oldest steps are kept and the rest counted as dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from scalewatch.app.cli import main
from scalewatch.spool import spooled_runs
from scalewatch.store.engine import Store, open_store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.schema import runs, telemetry_gaps
from tests._helpers.faults import Service
from tests._helpers.waiting import wait_for
from tests.scaler.test_control import step_rows

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

STEPS = 200
OVERFLOWS = (17, 90)

JOB = """
import sys, time
import torch
import scalewatch
from scalewatch.telemetry import TelemetrySettings
url, steps, bound, hang = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "hang"
overflows = {int(s) for s in sys.argv[5].split(",") if s}
name = sys.argv[6]
settings = TelemetrySettings(url, spool_bytes=int(bound) if bound else None, retry_s=0.2)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
gs = scalewatch.GradScaler("cpu", growth_interval=4, telemetry=settings, run_name=name)
for step in range(1, steps + 1):
    opt.zero_grad()
    gs.scale(model(torch.randn(4, 8)).pow(2).mean()).backward()
    if step in overflows:
        model.weight.grad.view(-1)[0] = float("inf")
    gs.step(opt)
    gs.update()
assert gs.flush(30)
print("flushed", flush=True)
if hang:
    time.sleep(600)
gs.close()
"""


def job(
    url: str, steps: int, *, bound: int | None = None, hang: bool = False, name: str = "spooled"
) -> subprocess.Popen[str]:
    marks = ",".join(map(str, OVERFLOWS))
    command = [
        sys.executable,
        "-c",
        JOB,
        url,
        str(steps),
        str(bound or ""),
        "hang" if hang else "",
        marks,
        name,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def the_run(store: Store) -> tuple[int, str, int]:
    with store.read() as conn:
        row = conn.execute(
            select(runs.c.id, runs.c.status, runs.c.dropped).where(runs.c.name == "spooled")
        ).one()
    return row.id, row.status, row.dropped


def test_a_killed_jobs_spool_reaches_the_service_through_the_next_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    store = open_store(url)
    monkeypatch.setenv("SCALEWATCH_TOKEN", create_identity(store, "job", Role.WRITER, by="t").token)
    served = Service(url, tmp_path)  # not started yet: the job finds nobody at its address
    killed = job(served.base_url, STEPS, hang=True)
    try:
        assert killed.stdout is not None and killed.stdout.readline() == "flushed\n"
        os.kill(killed.pid, signal.SIGKILL)
    finally:
        killed.kill()
        killed.communicate(timeout=10)
    spool = tmp_path / "spool"
    # The job's writer process writes what reached it, then lets the spool go.
    waiting = wait_for(lambda: [r for r in spooled_runs(spool) if not r.held], 60, "the spool")
    assert [r.name for r in waiting] == ["spooled"]
    served.start()
    try:
        served.wait_healthy()
        assert main(["spool", "list"]) == 0
        nxt = job(served.base_url, 3, name="next")  # the next scalewatch process on this node
        assert nxt.communicate(timeout=60)[0] == "flushed\n"
    finally:
        served.stop()
    run_id, status, dropped = the_run(store)
    rows = step_rows(store, run_id)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["step"] for r in rows if r["overflow"]] == list(OVERFLOWS)
    assert (status, dropped) == ("running", 0)  # killed: no end sent; it reads crashed
    assert spooled_runs(spool) == []


def test_past_the_spools_bound_the_oldest_steps_are_kept_and_the_rest_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    store = open_store(url)
    monkeypatch.setenv("SCALEWATCH_TOKEN", create_identity(store, "job", Role.WRITER, by="t").token)
    served = Service(url, tmp_path)
    ended = job(served.base_url, STEPS, bound=30_000)
    assert ended.communicate(timeout=60)[0] == "flushed\n"
    served.start()
    try:
        served.wait_healthy()
        assert main(["spool", "send"]) == 0
    finally:
        served.stop()
    run_id, status, dropped = the_run(store)
    kept = [r["step"] for r in step_rows(store, run_id)]
    assert kept == list(range(1, len(kept) + 1)) and 0 < len(kept) < STEPS
    assert (status, dropped) == ("finished", STEPS - len(kept))
    with store.read() as conn:
        gaps = conn.execute(
            select(telemetry_gaps.c.first_step, telemetry_gaps.c.last_step, telemetry_gaps.c.reason)
        ).all()
    assert gaps[0].first_step == len(kept) + 1 and gaps[-1].last_step == STEPS
    assert {g.reason for g in gaps} == {"the spool is full"}
    assert "batches stored" in capsys.readouterr().out
