from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from scalewatch.store.engine import Store
from tests._helpers.service import add_run, simulate


def test_metrics_parse_and_follow_the_store(client: TestClient, store: Store) -> None:
    records = simulate(120, {5, 50, 51})
    run = add_run(store, records, name="gpt")

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        sample.name: sample
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    labels = {"run_id": str(run), "run_name": "gpt"}
    assert samples["scalewatch_scale"].labels == labels
    assert samples["scalewatch_scale"].value == records[-1].scale_after
    assert samples["scalewatch_steps_total"].value == 120
    assert samples["scalewatch_overflows_total"].value == 3
    assert samples["scalewatch_skipped_steps_total"].value == 3
    assert samples["scalewatch_growth_tracker"].value == records[-1].growth_tracker
    assert samples["scalewatch_run_running"].value == 1

    add_run(store, simulate(5, set()), name="second")
    families = list(text_string_to_metric_families(client.get("/metrics").text))
    scale = next(family for family in families if family.name == "scalewatch_scale")
    assert len(scale.samples) == 2


def test_the_schedules_drift_is_a_gauge_of_the_runs_that_register_one(
    client: TestClient, store: Store
) -> None:
    records = [dataclasses.replace(r, schedule_drift=r.step // 40) for r in simulate(120, {5})]
    add_run(store, records, name="drifting")
    add_run(store, simulate(5, set()), name="unscheduled")
    families = list(text_string_to_metric_families(client.get("/metrics").text))
    drift = next(family for family in families if family.name == "scalewatch_schedule_drift")
    assert [(s.labels["run_name"], s.value) for s in drift.samples] == [("drifting", 3)]


def test_the_gradient_norm_is_a_gauge_of_the_runs_that_record_one(
    client: TestClient, store: Store
) -> None:
    records = [dataclasses.replace(r, grad_norm=r.step / 8) for r in simulate(20, set())]
    add_run(store, records, name="measured")
    add_run(store, simulate(5, set()), name="unmeasured")
    families = list(text_string_to_metric_families(client.get("/metrics").text))
    norm = next(family for family in families if family.name == "scalewatch_grad_norm")
    assert [(s.labels["run_name"], s.value) for s in norm.samples] == [("measured", 2.5)]


def test_control_characters_of_a_runs_name_never_reach_the_scrape(
    client: TestClient, store: Store
) -> None:
    add_run(store, simulate(3, set()), name="gpt\x1b[2J\r\tx\x7fy\x9b\nz")

    body = client.get("/metrics").content

    controls = {byte for byte in body if byte < 0x20 or byte == 0x7F} - {ord("\n")}
    assert controls == set()
    assert "\x9b" not in body.decode()
    scale = next(
        family
        for family in text_string_to_metric_families(body.decode())
        if family.name == "scalewatch_scale"
    )
    assert [sample.labels["run_name"] for sample in scale.samples] == [
        "gpt\\u001b[2J\\u000d\\u0009x\\u007fy\\u009b\\u000az"
    ]
