from __future__ import annotations

from fastapi.testclient import TestClient

from scalewatch.store.engine import Store
from tests._helpers.golden import GOLDEN_CSV, ROWS
from tests._helpers.service import add_run


def test_csv_export_golden_body(client: TestClient, store: Store) -> None:
    run = add_run(store, ROWS, name="bert large/fp16")

    response = client.get(f"/api/runs/{run}/export?what=steps&format=csv")

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="bert-large-fp16-{run}-steps.csv"'
    )
    assert response.text == GOLDEN_CSV


def test_overflows_export_as_json_lines_in_a_range(client: TestClient, store: Store) -> None:
    run = add_run(store, ROWS, name="../../etc/passwd")

    response = client.get(f"/api/runs/{run}/export?what=overflows&format=jsonl&start=2&end=3")

    assert response.headers["content-disposition"] == (
        f'attachment; filename="etc-passwd-{run}-overflows.jsonl"'
    )
    assert response.text == (
        '{"step": 2, "wall_time": 1700000001.25, "scale": 65536.0, "overflow": true,'
        ' "skipped": true, "inf_ranks": [0, 3], "scale_after": 32768.0, "growth_tracker": 0,'
        ' "growth_interval": 2, "growth_factor": 2.0, "backoff_factor": 0.5,'
        ' "control_version": 0, "loss": null, "loss_nonfinite_ranks": [], "params_omitted": 0,'
        ' "lr": 0.001, "lr_groups": [[0.001, 0.0005]], "schedule_drift": 0, "grad_norm": null,'
        ' "loss_spike": false, "grad_norm_spike": false, "spike_skipped": false,'
        ' "params": [{"rank": 0, "name": "fc.bias", "kind": "nan", "count": 1},'
        ' {"rank": 3, "name": "fc.weight", "kind": "inf", "count": 8}]}\n'
    )


def test_overflows_export_csv_golden_body(client: TestClient, store: Store) -> None:
    run = add_run(store, ROWS)

    response = client.get(f"/api/runs/{run}/export?what=overflows&format=csv")

    assert response.text == (
        GOLDEN_CSV.splitlines(keepends=True)[0].replace("\n", ",params\n")
        + '2,1700000001.25,65536.0,1,1,"0,3",32768.0,0,2,2.0,0.5,0,,,0,0.001,"[[0.001,0.0005]]",'
        "0,,0,0,0,"
        "0:fc.bias:nan:1;3:fc.weight:inf:8\n"
    )


def test_a_bad_export_is_refused_before_any_byte(client: TestClient, store: Store) -> None:
    run = add_run(store, ROWS)
    for query in ("format=xml", "what=everything", "start=-5"):
        with client.stream("GET", f"/api/runs/{run}/export?{query}") as response:
            assert response.status_code == 422, query
            assert response.headers["content-type"] == "application/json"
            assert "content-disposition" not in response.headers
            response.read()
            assert "detail" in response.json()
    assert client.get("/api/runs/42/export").status_code == 404


def test_empty_export_has_the_header_only(client: TestClient, store: Store) -> None:
    run = add_run(store, [])
    assert client.get(f"/api/runs/{run}/export").text.startswith("step,wall_time,")
    assert client.get(f"/api/runs/{run}/export").text.count("\n") == 1
    assert client.get(f"/api/runs/{run}/export?format=jsonl").text == ""
