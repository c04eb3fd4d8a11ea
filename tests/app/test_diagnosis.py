"""Overflow diagnosis over HTTP: overflow rows, one overflow in full, the parameter ranking,
and the exports' diagnosis columns."""

from __future__ import annotations

import csv
import io
import json

import pytest
from fastapi.testclient import TestClient

from scalewatch.store.engine import Store
from tests._helpers.golden import FC1, HEAD, diagnosed
from tests._helpers.service import add_run, simulate


def test_overflow_rows_carry_their_parameters_and_loss_ranks(
    client: TestClient, store: Store
) -> None:
    run = add_run(store, diagnosed())

    items = client.get(f"/api/runs/{run}/overflows").json()["items"]

    assert [item["step"] for item in items] == [3, 6, 9]
    assert items[0]["params"] == [
        {"rank": 0, "name": HEAD, "kind": "nan", "count": 3},
        {"rank": 1, "name": FC1, "kind": "inf", "count": 12},
    ]
    assert [item["inf_ranks"] for item in items] == [[0, 1], [1], [1]]
    assert [item["loss_nonfinite_ranks"] for item in items] == [[], [1], []]
    # The inf loss is stored as no loss; loss_nonfinite_ranks says whose it was.
    assert [item["loss"] for item in items] == [3.25, None, 1.75]
    assert [item["params_omitted"] for item in items] == [0, 0, 7]
    # A page boundary between overflows: each page reads its own steps' findings.
    second = client.get(f"/api/runs/{run}/overflows?after=3&limit=1").json()
    assert second["items"][0]["params"] == [{"rank": 1, "name": FC1, "kind": "both", "count": 40}]
    assert second["next"] == 6
    # Without the parameters, for a chart's markers: null, the rest as it was.
    bare = client.get(f"/api/runs/{run}/overflows?params=false").json()["items"]
    assert [item["params"] for item in bare] == [None, None, None]
    assert [{**item, "params": None} for item in items] == bare


def test_one_overflow_in_full(client: TestClient, store: Store) -> None:
    records = diagnosed()
    run = add_run(store, records)

    detail = client.get(f"/api/runs/{run}/overflows/3").json()

    record = records[2]
    assert detail == {
        "run": run,
        "step": 3,
        "wall_time": record.wall_time,
        "scale": record.scale,
        "scale_after": record.scale_after,
        "skipped": True,
        "inf_ranks": [0, 1],
        "growth_tracker": record.growth_tracker,
        "growth_interval": record.growth_interval,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "control_version": 0,
        "loss": 3.25,
        "loss_nonfinite_ranks": [],
        "params": [
            {"rank": 0, "name": HEAD, "kind": "nan", "count": 3},
            {"rank": 1, "name": FC1, "kind": "inf", "count": 12},
        ],
        "params_omitted": 0,
    }
    assert client.get(f"/api/runs/{run}/overflows/6").json()["loss_nonfinite_ranks"] == [1]


@pytest.mark.parametrize(
    ("path", "code", "detail"),
    [
        ("/api/runs/{run}/overflows/4", 404, "step 4 of run {run} did not overflow"),
        ("/api/runs/{run}/overflows/11", 404, "run {run} has no step 11"),
        ("/api/runs/999/overflows/3", 404, "no run 999"),
        ("/api/runs/{run}/overflows/-1", 422, None),
        ("/api/runs/{run}/overflows/x", 422, None),
    ],
)
def test_a_step_that_is_no_overflow_is_404_and_says_why(
    client: TestClient, store: Store, path: str, code: int, detail: str | None
) -> None:
    run = add_run(store, diagnosed())

    response = client.get(path.format(run=run))

    assert response.status_code == code
    if detail is not None:
        assert response.json() == {"detail": detail.format(run=run)}


def test_parameters_are_ranked_by_the_overflows_they_were_found_at(
    client: TestClient, store: Store
) -> None:
    run = add_run(store, diagnosed())

    ranking = client.get(f"/api/runs/{run}/params").json()

    assert ranking == {
        "run": run,
        "start": None,
        "end": None,
        "overflows": 3,
        "params_omitted": 7,
        "params": [
            # Two overflows each: the one seen latest first.
            {
                "name": HEAD,
                "overflows": 2,
                "ranks": [0, 1],
                "kinds": ["inf", "nan"],
                "last_step": 9,
                "count": 4,
            },
            {
                "name": FC1,
                "overflows": 2,
                "ranks": [1],
                "kinds": ["both", "inf"],
                "last_step": 6,
                "count": 52,
            },
        ],
    }
    window = client.get(f"/api/runs/{run}/params?start=4&end=8").json()
    assert (window["start"], window["end"], window["overflows"]) == (4, 8, 1)
    assert [(p["name"], p["overflows"], p["kinds"]) for p in window["params"]] == [
        (FC1, 1, ["both"])
    ]
    first = client.get(f"/api/runs/{run}/params?limit=1").json()["params"]
    assert [p["name"] for p in first] == [HEAD]
    empty = client.get(f"/api/runs/{run}/params?start=8&end=4").json()
    assert (empty["overflows"], empty["params"]) == (0, [])


@pytest.mark.parametrize(
    "query", ["start=-1", "end=-5", "limit=0", "limit=1001", "start=x", f"end={2**63}"]
)
def test_the_ranking_refuses_bad_bounds(client: TestClient, store: Store, query: str) -> None:
    run = add_run(store, diagnosed())
    response = client.get(f"/api/runs/{run}/params?{query}")
    assert response.status_code == 422
    assert client.get("/api/runs/999/params").status_code == 404


def test_the_overflows_export_carries_the_parameters(client: TestClient, store: Store) -> None:
    run = add_run(store, diagnosed())

    text = client.get(f"/api/runs/{run}/export?what=overflows&format=csv").text
    rows = list(csv.DictReader(io.StringIO(text)))

    assert text.splitlines()[0].endswith(
        ",loss,loss_nonfinite_ranks,params_omitted,lr,lr_groups,schedule_drift,grad_norm,loss_spike,grad_norm_spike,spike_skipped,params"
    )
    assert [row["step"] for row in rows] == ["3", "6", "9"]
    assert [row["params"] for row in rows] == [
        f"0:{HEAD}:nan:3;1:{FC1}:inf:12",
        f"1:{FC1}:both:40",
        f"1:{HEAD}:inf:1",
    ]
    assert [row["loss_nonfinite_ranks"] for row in rows] == ["", "1", ""]
    assert [row["loss"] for row in rows] == ["3.25", "", "1.75"]
    assert [row["params_omitted"] for row in rows] == ["0", "0", "7"]

    lines = client.get(f"/api/runs/{run}/export?what=overflows&format=jsonl&start=4").text
    exported = [json.loads(line) for line in lines.splitlines()]
    assert [(e["step"], e["loss"], e["loss_nonfinite_ranks"]) for e in exported] == [
        (6, None, [1]),
        (9, 1.75, []),
    ]
    assert exported[0]["params"] == [{"rank": 1, "name": FC1, "kind": "both", "count": 40}]


def test_the_steps_export_has_a_loss_column(client: TestClient, store: Store) -> None:
    run = add_run(store, diagnosed())

    text = client.get(f"/api/runs/{run}/export?what=steps&format=csv&end=3").text
    rows = list(csv.DictReader(io.StringIO(text)))

    assert [row["loss"] for row in rows] == ["3.75", "3.5", "3.25"]
    assert "params" not in rows[0]  # the parameters are the overflows export's
    lines = client.get(f"/api/runs/{run}/export?format=jsonl&start=6&end=6").text
    assert json.loads(lines)["loss"] is None


def test_clean_runs_carry_no_diagnosis(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(50, {10, 20}))

    items = client.get(f"/api/runs/{run}/overflows").json()["items"]

    assert [(i["params"], i["loss_nonfinite_ranks"], i["loss"]) for i in items] == [
        ([], [], None),
        ([], [], None),
    ]
    assert client.get(f"/api/runs/{run}/params").json()["params"] == []
    text = client.get(f"/api/runs/{run}/export?what=overflows").text
    assert [row["params"] for row in csv.DictReader(io.StringIO(text))] == ["", ""]


def test_the_openapi_document_describes_the_diagnosis(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    detail = paths["/api/runs/{run}/overflows/{step}"]["get"]
    assert detail["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OverflowDetail"
    }
    assert "404" in detail["responses"]
    ranking = paths["/api/runs/{run}/params"]["get"]
    assert {p["name"] for p in ranking["parameters"]} == {"run", "start", "end", "limit"}
    schemas = document["components"]["schemas"]
    assert set(schemas["OverflowItem"]["properties"]) >= {
        "params",
        "loss_nonfinite_ranks",
        "params_omitted",
        "loss",
    }
    assert schemas["OverflowParam"]["properties"]["kind"]["enum"] == ["inf", "nan", "both"]
