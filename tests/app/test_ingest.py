"""A job's records through the service: a writer's token opens its run and posts numbered
batches; a batch sent again stores nothing; the answers carry the pending requests; the
token reaches its own runs and nothing else."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import func, select

from scalewatch._control import ControlOutcome, ControlSource
from scalewatch.app.ingest.models import ControlIn, ControlValuesIn, StepIn
from scalewatch.store.engine import Store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.records import ParamFinding
from scalewatch.store.runs import finding_rows, record_gap, step_values
from scalewatch.store.schema import overflow_params, runs, steps, telemetry_gaps
from scalewatch.store.step_rows import COLUMNS
from scalewatch.telemetry._batches import items
from scalewatch.telemetry._queue import Diagnosed, RecordGap, WriteOutcome
from tests._helpers.service import CONTROL, auth, simulate


def test_a_steps_fields_are_the_steps_columns_in_their_order() -> None:
    """The ingest takes a validated step's values in order as its row: whatever order the
    job sent its fields in, and with the fields an older job leaves out at their defaults."""
    sent = items([step_values(record) for record in simulate(1, set())], reason="")[0]
    step = dict(reversed(sent["steps"][0].items()))
    del step["loss_spike"]
    parsed = StepIn.model_validate(step)
    assert tuple(vars(parsed)) == COLUMNS
    assert tuple(vars(parsed).values()) == tuple(
        False if name == "loss_spike" else sent["steps"][0][name] for name in COLUMNS
    )


def opening(uid: str, *, resume: bool = False) -> dict[str, Any]:
    return {
        "uid": uid,
        "name": "job-42",
        "world_size": 2,
        "config": {"init_scale": 2.0**16},
        "control": CONTROL,
        "started_at": 1_700_000_000.0,
        "resume": resume,
        "host": "node-7",
        "pid": 4242,
        "torch_version": "2.9.0",
    }


def step_commands(first: int, count: int) -> list[Any]:
    """Steps as the writer's queue holds them; the overflow at step 3 names its parameter."""
    commands: list[Any] = []
    for record in simulate(count, {3}, first=first):
        if record.overflow:
            found = ParamFinding(rank=1, name="layers.0.weight", kind="inf", count=2)
            record = type(record)(**{**_fields(record), "params": (found,)})
            commands.append(Diagnosed(step_values(record), finding_rows([record])))
        else:
            commands.append(step_values(record))
    return commands


def _fields(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


def counts(store: Store, run_id: int) -> tuple[int, int, int, int]:
    with store.read() as conn:
        stored = conn.execute(select(func.count()).where(steps.c.run_id == run_id)).scalar()
        found = conn.execute(
            select(func.count()).where(overflow_params.c.run_id == run_id)
        ).scalar()
        gaps = conn.execute(select(func.count()).where(telemetry_gaps.c.run_id == run_id)).scalar()
        dropped = conn.execute(select(runs.c.dropped).where(runs.c.id == run_id)).scalar()
    return int(stored or 0), int(found or 0), int(gaps or 0), int(dropped or 0)


@pytest.mark.parametrize("body", ['{"hysteresis": true}', '{"growth_factor": false}'])
def test_a_boolean_is_no_factor(body: str) -> None:
    """A lax float takes true as 1.0: a body its schema calls invalid would be stored."""
    for model in (ControlIn, ControlValuesIn):
        with pytest.raises(ValidationError):
            model.model_validate_json(body)
        assert model.model_validate_json(body.replace("true", "2").replace("false", "2.0"))


def test_a_boolean_is_no_number_of_a_step() -> None:
    step = items([step_values(record) for record in simulate(1, set())], reason="")[0]["steps"][0]
    StepIn.model_validate(step)
    for name in ("scale", "wall_time", "growth_factor"):
        with pytest.raises(ValidationError):
            StepIn.model_validate({**step, name: True})


def test_a_writer_records_its_run_once_and_reaches_nothing_else(
    client: TestClient, store: Store
) -> None:
    writer = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    other = auth(create_identity(store, "job-43", Role.WRITER, by="test").token)
    operator = auth(create_identity(store, "ops", Role.OPERATOR, by="test").token)
    uid = uuid.uuid4().hex

    opened = client.post("/api/ingest/runs", json=opening(uid), headers=writer)
    assert opened.status_code == 200, opened.text
    run = opened.json()["id"]
    assert opened.json()["sequence"] == 0
    # Its making answered again (the first answer lost): the same run.
    assert client.post("/api/ingest/runs", json=opening(uid), headers=writer).json()["id"] == run
    with store.read() as conn:
        row = conn.execute(select(runs).where(runs.c.id == run)).one()
    assert (row.owner, row.host, row.pid, row.torch_version) == ("job-42", "node-7", 4242, "2.9.0")

    batch = {
        "sequence": 1,
        "items": [
            *items(step_commands(1, 10), reason=""),
            *items([RecordGap(11, 12, 2)], reason="telemetry queue full"),
        ],
    }
    first = client.post(f"/api/ingest/runs/{run}/batches", json=batch, headers=writer)
    assert first.status_code == 200, first.text
    assert first.json() == {"sequence": 1, "stored": True, "control": []}
    assert counts(store, run) == (10, 1, 1, 2)
    again = client.post(f"/api/ingest/runs/{run}/batches", json=batch, headers=writer)
    assert again.json() == {"sequence": 1, "stored": False, "control": []}
    assert counts(store, run) == (10, 1, 1, 2)  # nothing twice: not the gap, not the drops

    # A request filed by an operator rides the next answer; its outcome settles it.
    asked = client.post(
        f"/api/runs/{run}/control", json={"growth_interval": 3}, headers=operator
    ).json()
    poll = client.post(
        f"/api/ingest/runs/{run}/batches", json={"sequence": 1}, headers=writer
    ).json()
    assert poll["control"] == [{"id": asked["id"], "values": {"growth_interval": 3}}]
    outcome = ControlOutcome(
        source=ControlSource.REQUEST,
        request_id=asked["id"],
        values={"growth_interval": 3},
        applied=True,
        reason=None,
        state={**{k: v for k, v in CONTROL.items()}, "growth_interval": 3},
        version=1,
    )
    done = client.post(
        f"/api/ingest/runs/{run}/batches",
        json={
            "sequence": 2,
            "items": items([WriteOutcome(13, 1.0, outcome)], reason=""),
            "end": "finished",
        },
        headers=writer,
    ).json()
    assert done == {"sequence": 2, "stored": True, "control": []}
    control = client.get(f"/api/runs/{run}/control", headers=operator).json()
    assert (control["history"][0]["status"], control["history"][0]["applied_step"]) == (
        "applied",
        13,
    )
    assert client.get(f"/api/runs/{run}", headers=operator).json()["status"] == "finished"

    # Its own run and nothing else: no reads, no other run, no control, no tokens.
    bad_step = {"sequence": 3, "items": [{"kind": "steps", "steps": [{"step": 1}]}]}
    for method, path, body, headers in [
        ("POST", f"/api/ingest/runs/{run}/batches", {"sequence": 3}, other),
        ("POST", "/api/ingest/runs", opening(uid, resume=True), other),
        ("GET", f"/api/runs/{run}", None, writer),
        ("GET", "/api/runs", None, writer),
        ("GET", f"/api/runs/{run}/export", None, writer),
        ("POST", f"/api/runs/{run}/control", {"growth_interval": 5}, writer),
        ("GET", "/api/tokens", None, writer),
    ]:
        answer = client.request(method, path, json=body, headers=headers)
        assert answer.status_code == 403, (method, path, answer.text)
    refused = client.post(f"/api/ingest/runs/{run}/batches", json=bad_step, headers=writer)
    assert refused.status_code == 422  # a step's fields are the step schema's, all of them
    assert counts(store, run) == (10, 1, 1, 2)


def test_a_batch_stored_in_part_before_the_service_stopped_is_stored_whole_once(
    client: TestClient, store: Store
) -> None:
    writer = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    run = client.post("/api/ingest/runs", json=opening(uuid.uuid4().hex), headers=writer).json()
    batch = {
        "sequence": 1,
        "items": [
            *items([RecordGap(1, 2, 2)], reason="telemetry queue full"),
            *items(step_commands(3, 5), reason=""),
        ],
    }
    # The service stored the gap, then was killed before the steps and the batch's number.
    record_gap(store, run["id"], 1, 2, 2, "telemetry queue full")
    answer = client.post(f"/api/ingest/runs/{run['id']}/batches", json=batch, headers=writer)
    assert answer.json()["stored"] is True
    assert counts(store, run["id"]) == (5, 1, 1, 2)


@pytest.mark.postgres
def test_a_writer_records_its_run_once_on_postgresql(
    pg_client: TestClient, pg_store: Store
) -> None:
    test_a_writer_records_its_run_once_and_reaches_nothing_else(pg_client, pg_store)


def test_a_sqlite_stores_batches_are_stored_one_at_a_time(
    client: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite has one writer: batches of several runs posted at once are stored by one
    thread at a time, not by threads that wait on its lock (and all are stored)."""
    import scalewatch.app.routes.ingest as ingest_route

    writer = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    run_ids = [
        client.post("/api/ingest/runs", json=opening(uuid.uuid4().hex), headers=writer).json()["id"]
        for _ in range(4)
    ]
    inside, most, lock = 0, 0, threading.Lock()
    store_batch = ingest_route.store_batch

    def counted(*args: Any) -> Any:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            time.sleep(0.05)  # long enough for the other posts to arrive meanwhile
            return store_batch(*args)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(ingest_route, "store_batch", counted)

    def post(run: int) -> int:
        batch = {"sequence": 1, "items": items(step_commands(1, 5), reason="")}
        answer = client.post(f"/api/ingest/runs/{run}/batches", json=batch, headers=writer)
        return answer.status_code

    with ThreadPoolExecutor(len(run_ids)) as pool:
        assert list(pool.map(post, run_ids)) == [200] * len(run_ids)
    assert most == 1
    assert [counts(store, run)[0] for run in run_ids] == [5] * len(run_ids)


def test_a_batch_is_refused_as_fastapi_words_a_body_and_documented_as_it_is_read(
    client: TestClient, store: Store
) -> None:
    """The route validates a batch from its bytes itself: its 422s locate each error under
    ``body``, a body that is not JSON is told so, and the OpenAPI document's schema of the
    body takes what the sender sends and refuses what the route refuses."""
    writer = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    run = client.post("/api/ingest/runs", json=opening(uuid.uuid4().hex), headers=writer).json()
    path = f"/api/ingest/runs/{run['id']}/batches"
    good = {"sequence": 1, "items": items(step_commands(1, 5), reason="")}
    bad = {"sequence": 1, "items": [{"kind": "steps", "steps": [{"step": -1}]}]}

    refused = client.post(path, json=bad, headers=writer)
    assert refused.status_code == 422
    locations = [error["loc"] for error in refused.json()["detail"]]
    assert ["body", "items", 0, "steps", "steps", 0, "step"] in locations
    assert all(loc[0] == "body" for loc in locations)
    # Not UTF-8, an integer of 5000 digits, nesting too deep: FastAPI's json.loads made them 400s.
    undecodable = (b'{"sequence": 1, "items": ["\xff"]}', b'{"sequence": ' + b"9" * 5000 + b"}")
    for raw in (b"{", b"", b"[]", *undecodable, b'{"items": ' + b"[" * 5000 + b"]" * 5000 + b"}"):
        garbled = client.post(
            path, content=raw, headers={**writer, "Content-Type": "application/json"}
        )
        assert garbled.status_code == 422 and garbled.json()["detail"][0]["loc"][0] == "body"
        assert len(garbled.content) < 1000  # the body is not echoed
    form = client.post(
        path, content=b"sequence=1", headers={**writer, "Content-Type": "text/plain"}
    )
    assert form.status_code == 422 and form.json()["detail"][0]["type"] == "content_type"
    assert counts(store, run["id"]) == (0, 0, 0, 0)

    document = client.get("/openapi.json", headers=writer).json()
    body = document["paths"]["/api/ingest/runs/{run}/batches"]["post"]["requestBody"]
    schema = {**body["content"]["application/json"]["schema"], "components": document["components"]}
    validator = jsonschema_rs.validator_for(schema)
    assert validator.is_valid(good) and not validator.is_valid(bad)
    stored = client.post(path, json=good, headers=writer)
    assert stored.status_code == 200 and counts(store, run["id"])[0] == 5


def _overflows(client: TestClient, run: int) -> list[str]:
    """The run's overflows as its export writes them (a loopback read), less the header."""
    answer = client.get(f"/api/runs/{run}/export", params={"what": "overflows"})
    assert answer.status_code == 200, answer.text
    return answer.text.splitlines()[1:]


def test_steps_sent_as_rows_are_stored_as_the_same_steps_sent_as_objects(
    client: TestClient, store: Store
) -> None:
    """A run's opening names the columns of a step row; steps posted as rows of them (the
    overflow's findings with them) store what the same steps posted as objects do."""
    writer = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    runs_of: dict[bool, int] = {}
    for rows in (False, True):
        opened = client.post("/api/ingest/runs", json=opening(uuid.uuid4().hex), headers=writer)
        assert opened.json()["step_columns"] == list(COLUMNS)
        run = runs_of[rows] = opened.json()["id"]
        body = json.loads(
            json.dumps(
                {
                    "sequence": 1,
                    "items": items(step_commands(1, 10), reason="", rows=COLUMNS if rows else None),
                }
            )
        )
        assert body["items"][0]["kind"] == ("step_rows" if rows else "steps")
        answer = client.post(f"/api/ingest/runs/{run}/batches", json=body, headers=writer)
        assert answer.json() == {"sequence": 1, "stored": True, "control": []}
        assert counts(store, run) == (10, 1, 0, 0)
    as_rows, as_objects = (_overflows(client, runs_of[rows]) for rows in (True, False))
    assert as_rows == as_objects
    assert len(as_rows) == 1 and "layers.0.weight" in as_rows[0]
    with store.read() as conn:
        stored = [
            conn.execute(
                select(*[c for c in steps.c if c.name != "run_id"])
                .where(steps.c.run_id == runs_of[rows])
                .order_by(steps.c.step)
            ).all()
            for rows in (True, False)
        ]
    assert stored[0] == stored[1] and len(stored[0]) == 10


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda item: item["columns"].reverse(), ["columns"]),
        (lambda item: item["columns"].pop(), ["columns"]),
        (lambda item: item["rows"][1].pop(), ["rows", 1]),
        (lambda item: item["rows"][1].append(0), ["rows", 1]),
        (lambda item: item["rows"][1].__setitem__(0, -1), ["rows", 1, 0]),
        (lambda item: item["rows"][1].__setitem__(3, 1), ["rows", 1, 3]),  # no boolean
        (lambda item: item["rows"][1].__setitem__(2, "1.0"), ["rows", 1, 2]),
        (lambda item: item["rows"].clear(), ["rows"]),
    ],
)
def test_rows_of_other_columns_or_values_are_refused_whole(
    client: TestClient, store: Store, change: Any, where: list[Any]
) -> None:
    """Rows whose columns are not the service's, a row of another length, a value of
    another type or out of range: a 422 that locates it, and nothing of the batch stored."""
    writer = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    run = client.post("/api/ingest/runs", json=opening(uuid.uuid4().hex), headers=writer).json()
    body = json.loads(
        json.dumps({"sequence": 1, "items": items(step_commands(1, 3), reason="", rows=COLUMNS)})
    )
    change(body["items"][0])
    refused = client.post(f"/api/ingest/runs/{run['id']}/batches", json=body, headers=writer)
    assert refused.status_code == 422, refused.text
    locations = [error["loc"] for error in refused.json()["detail"]]
    # Under the batch's item and its tag: ["body", "items", 0, "step_rows", ...]
    assert [
        list(loc[4 : 4 + len(where)])
        for loc in locations
        if loc[:4] == ["body", "items", 0, "step_rows"]
    ] == [where] * len(locations), locations
    assert counts(store, run["id"]) == (0, 0, 0, 0)
