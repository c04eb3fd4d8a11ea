"""A 2-rank gloo job recording through a real ``scalewatch serve`` with a writer's token,
the service killed and restarted mid-run (the batches meanwhile spooled on the node, then
sent): every step stored once, the overflows on the rank that made them, control requests
applied at one step on both ranks."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from scalewatch.spool import spooled_runs
from scalewatch.store.control import control_history
from scalewatch.store.engine import open_store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.schema import runs
from tests._helpers.faults import TOKEN, service
from tests._helpers.ranks import Ranks
from tests._helpers.waiting import wait_for
from tests.scaler.test_control import PAUSE_AT, SENTINEL, _controlled, _first_step, step_rows

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def test_a_job_records_through_the_service_across_its_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    store = open_store(url)
    writer = create_identity(store, "job-42", Role.WRITER, by="test").token
    go = tmp_path / "go"
    with service(url, tmp_path) as served:
        served.wait_healthy()
        monkeypatch.setenv("SCALEWATCH_TOKEN", writer)  # what the ranks and their writer read
        with Ranks(_controlled, 2, served.base_url, str(go)) as ranks:

            def paused_run() -> int | None:
                with store.read() as conn:
                    row = conn.execute(select(runs.c.id, runs.c.last_step)).first()
                return row.id if row is not None and row.last_step >= PAUSE_AT else None

            run_id = wait_for(paused_run, 150, f"the ranks to reach step {PAUSE_AT}")
            served.kill()  # mid-run: the ranks train on while the service is away
            go.touch()
            wait_for(lambda: spooled_runs(tmp_path / "spool"), 60, "batches in the spool")
            served.start()
            served.wait_healthy()
            admin = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=served.base_url, headers=admin, timeout=10) as http:
                growth = http.post(
                    f"/api/runs/{run_id}/control",
                    json={"growth_interval": 3, "growth_factor": 4.0},
                )
                assert growth.status_code == 202, growth.text
                last = http.post(f"/api/runs/{run_id}/control", json={"backoff_factor": SENTINEL})
                assert last.status_code == 202, last.text
            results = ranks.results(timeout=150)
        wait_for(
            lambda: store.engine.connect().execute(
                select(runs.c.status).where(runs.c.id == run_id)
            ).scalar() == "finished",
            30,
            "the run's end",
        )  # fmt: skip
    history = {row.id: row for row in control_history(store, run_id)}
    rows = step_rows(store, run_id)
    with store.read() as conn:
        run = conn.execute(select(runs).where(runs.c.id == run_id)).one()
    store.close()

    scales, states = results[0]["scales"], results[0]["states"]
    assert results[1]["scales"] == scales and results[1]["states"] == states
    # Every step once, as rank 0 took it; the overflows on rank 1, which made them.
    assert [r["step"] for r in rows] == list(range(1, len(scales) + 1))
    assert [r["scale_after"] for r in rows] == scales
    assert [r["inf_ranks"] for r in rows if r["overflow"]] == ["1"] * (len(scales) // 7)
    assert (run.owner, run.dropped, run.batch_sequence > 1) == ("job-42", 0, True)
    # The requests reached the job through the batches' answers, each applied at one step.
    applied = _first_step(states, "growth_interval", 3)
    assert history[growth.json()["id"]].applied_step == applied
    assert history[last.json()["id"]].applied_step == _first_step(
        states, "backoff_factor", SENTINEL
    )
    assert [r["control_version"] for r in rows] == [s["version"] for s in states]
    assert spooled_runs(tmp_path / "spool") == []  # what waited there while it was away: sent
