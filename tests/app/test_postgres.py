"""The service and the CLI over a PostgreSQL store (a throwaway server of the tests' own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.cli import main
from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.control import control_history
from scalewatch.store.engine import Store, open_store
from tests._helpers.ceiling import CeilingTrainer, enable, settled
from tests._helpers.golden import GOLDEN_CSV, ROWS, diagnosed
from tests._helpers.postgres import PASSWORD
from tests._helpers.service import LOCAL, TOKEN, add_run, auth, simulate

pytestmark = pytest.mark.postgres


def test_the_service_reads_a_runs_steps_from_postgresql(
    pg_client: TestClient, pg_store: Store
) -> None:
    records = simulate(20_000, {500, 17_777})
    run = add_run(pg_store, records, batch=4096)

    (listed,) = pg_client.get("/api/runs").json()["runs"]
    assert (listed["id"], listed["steps"], listed["overflows"]) == (run, 20_000, 2)
    whole = pg_client.get(f"/api/runs/{run}/steps?max_points=500").json()
    assert (whole["start"], whole["end"]) == (1, 20_000)
    assert sum(whole["series"]["overflows"]) == 2
    zoom = pg_client.get(f"/api/runs/{run}/steps?start=17770&end=17790&max_points=500").json()
    assert zoom["series"]["first_step"] == list(range(17_770, 17_791))
    at = zoom["series"]["first_step"].index(17_777)
    assert zoom["series"]["overflows"][at] == 1
    assert zoom["series"]["scale_last"][at] == records[17_776].scale_after
    overflows = pg_client.get(f"/api/runs/{run}/overflows").json()
    assert [item["step"] for item in overflows["items"]] == [500, 17_777]


def test_exports_and_control_on_postgresql_as_on_sqlite(
    pg_client: TestClient, pg_store: Store
) -> None:
    run = add_run(pg_store, ROWS, name="bert large/fp16")
    assert pg_client.get(f"/api/runs/{run}/export?what=steps&format=csv").text == GOLDEN_CSV
    response = pg_client.post(
        f"/api/runs/{run}/control", json={"growth_interval": 500}, headers=auth()
    )
    assert response.status_code in (200, 201, 202), response.text
    assert response.json()["status"] == "pending"
    assert PASSWORD not in pg_client.get("/api/runs").text


def test_the_diagnosis_on_postgresql_as_on_sqlite(
    pg_client: TestClient, pg_store: Store, client: TestClient, store: Store
) -> None:
    """Overflow rows, one overflow, the ranking and the overflows export: the same bodies."""
    pg_run, run = add_run(pg_store, diagnosed()), add_run(store, diagnosed())
    assert pg_run == run  # both stores are new: the same run id, so the same bodies
    for path in (
        "overflows",
        "overflows/6",
        "params",
        "params?start=4&end=8",
        "export?what=overflows&format=csv",
        "export?what=overflows&format=jsonl",
        "export?what=steps&format=csv",
    ):
        url = f"/api/runs/{run}/{path}"
        assert pg_client.get(url).text == client.get(url).text, path


def test_the_cli_on_postgresql_never_shows_the_password(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--db", pg_url]) == 0
    with open_store(pg_url) as store:
        run = add_run(store, ROWS, name="bert")
    assert main(["runs", "--db", pg_url]) == 0
    out = tmp_path / "steps.csv"
    assert main(["export", str(run), "--format", "csv", "-o", str(out), "--db", pg_url]) == 0
    assert out.read_text() == GOLDEN_CSV
    control = ["control", str(run), "--growth-interval", "500", "--no-wait", "--db", pg_url]
    assert main(control) == 0
    assert main(["export", "99", "--db", pg_url]) == 1
    printed = capsys.readouterr()
    assert "at revision" in printed.out and "bert" in printed.out
    assert "request 1 filed: growth_interval = 500 (pending" in printed.out
    assert PASSWORD not in printed.out + printed.err


def test_a_wrong_server_is_one_line_without_the_password(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = postgres_url.rsplit("/", 1)[0].replace("postgres@", f"postgres:{PASSWORD}@")
    assert main(["runs", "--db", f"{missing}/no_such_database"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "no_such_database" in err and PASSWORD not in err


def test_the_autopilot_settles_a_real_run_on_postgresql(
    pg_url: str, pg_store: Store, tmp_path: Path
) -> None:
    settings = Settings(
        db=pg_url, token=SecretStr(TOKEN), token_file=tmp_path / "t", autopilot_interval_s=0.02
    )
    trainer = CeilingTrainer(pg_url, ceiling=2.0**10, growth_interval=20)
    try:
        with TestClient(create_app(settings), base_url=LOCAL) as client:
            trainer.run_until(lambda: trainer.scaler.run_id is not None, timeout_s=30, what="run")
            enable(client, trainer.run_id)
            trainer.run_until(
                lambda: settled(pg_store, trainer.run_id), timeout_s=60, what="settled"
            )
            history = control_history(pg_store, trainer.run_id)
            assert history and all(row.requested_by == "autopilot" for row in history)
            assert client.get(f"/api/runs/{trainer.run_id}/autopilot").json()["decision"]
    finally:
        trainer.close()
