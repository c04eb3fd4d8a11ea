"""Hostile input: schema fuzzing, bad control values against a live scaler, auth, escaping."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS as REGISTERED_CHECKS
from schemathesis.checks import load_all_checks
from schemathesis.core.failures import AcceptedNegativeData, Failure, FailureGroup
from schemathesis.openapi.checks import RejectedPositiveData
from torch import nn

import scalewatch
from scalewatch.app.main import create_app
from scalewatch.app.middleware.penalty import FailurePenalty
from scalewatch.app.settings import Settings
from scalewatch.store.autopilot import get_autopilot
from scalewatch.store.control import control_history
from scalewatch.store.engine import Store, open_store
from scalewatch.store.identities import Role, create_identity, list_identities
from scalewatch.store.runs import create_run, end_run, heartbeat
from tests._helpers.service import (
    CONTROL,
    IDLE_AUTOPILOT_S,
    LOCAL,
    add_run,
    after_first_autopilot_tick,
    simulate,
)
from tests._helpers.waiting import wait_for

TOKEN = "hostile-test-token-0123456789abcdef"
load_all_checks()
# Every check schemathesis has (``--checks all``): the OpenAPI document says what the
# service does, valid requests accepted and invalid ones refused included.
CHECKS = REGISTERED_CHECKS.get_all()
# Per operation, run id choice and generation mode; about 25 s here in all.
EXAMPLES = 20
# What JSON Schema cannot say of a control request: min_scale <= scale <= max_scale, the
# values in effect standing in for those not sent (ControlRequest's description); of an
# autopilot's: min_growth_interval <= max_growth_interval (AutopilotIn's).
BOUNDS_MESSAGES = (
    "must be <= max_scale",
    "must be >= min_scale",
    "must be <= max_growth_interval",
)


def _refused_by_bounds(response: Any) -> bool:
    if response.status_code != 422:
        return False
    detail = response.json().get("detail")
    return bool(detail) and all(
        any(rule in str(error.get("msg", "")) for rule in BOUNDS_MESSAGES) for error in detail
    )


@pytest.fixture
def client(db_url: str, store: Store, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        db=db_url,
        token=SecretStr(TOKEN),
        token_file=tmp_path / "token",
        # The autopilot a test turns on is not evaluated while it reads the store back.
        autopilot_interval_s=IDLE_AUTOPILOT_S,
    )
    with TestClient(
        create_app(settings), raise_server_exceptions=False, base_url=LOCAL
    ) as test_client:
        yield after_first_autopilot_tick(test_client)


def auth(token: str = TOKEN, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {token}"}


# ------------------------------------------------------------ schema fuzzing


@pytest.mark.heavy
def test_schema_fuzzing_finds_no_5xx_and_no_undocumented_answer(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    running = add_run(store, simulate(300, {7, 50, 51}), name="running")
    finished = add_run(store, simulate(50, {3}), name="finished")
    end_run(store, finished)
    settings_ = Settings(
        db=db_url,
        token=SecretStr(TOKEN),
        token_file=tmp_path / "token",
        allowed_hosts="testserver",  # the name schemathesis's ASGI client sends
    )
    # Half the requests carry no token: a lockout would turn the rest into 429s.
    app = create_app(settings_, penalty=FailurePenalty(free_failures=10**9))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: Counter[int] = Counter()
    per_operation: Counter[str] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        label = f"{operation.method.upper()} {operation.path}"
        has_run = "{run}" in operation.path
        # A live stream of the running run never ends by itself; it is covered in tests/app.
        run_ids = [None, finished] + ([running] if not label.endswith("/stream") else [])
        plans = [(GenerationMode.POSITIVE, rid) for rid in (run_ids if has_run else [None])]
        if operation.query or has_run or operation.body or operation.headers:
            plans.append((GenerationMode.NEGATIVE, None))
        for mode, run_id in plans:
            fixed = {"run": run_id} if run_id is not None else None
            strategy = operation.as_strategy(generation_mode=mode, path_parameters=fixed)
            if label.endswith("/stream"):  # nor a drawn id that is the running run's
                strategy = strategy.filter(lambda case: _run_of(case) != str(running))

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def exchange(case: Any) -> None:
                heartbeat(store, running)  # keep the running run from reading as crashed
                for headers in (auth(), None):
                    response = case.call(headers=headers, timeout=10)
                    try:
                        case.validate_response(response, checks=CHECKS, headers=headers)
                    except (Failure, FailureGroup) as found:
                        failures = found.exceptions if isinstance(found, FailureGroup) else [found]
                        rejected = all(isinstance(f, RejectedPositiveData) for f in failures)
                        accepted = all(isinstance(f, AcceptedNegativeData) for f in failures)
                        # A body over the size limit is refused (413) before it is read, so
                        # whatever else is wrong with it: schemathesis counts no 413 refusal.
                        if not (
                            (rejected and _refused_by_bounds(response))
                            or (accepted and response.status_code == 413)
                        ):
                            raise
                    statuses[response.status_code] += 1

            before = sum(statuses.values())
            exchange()
            per_operation[label] += sum(statuses.values()) - before
    total = sum(statuses.values())
    print(f"\nschemathesis: {total} requests over {len(operations)} operations")
    print(f"status codes: {dict(sorted(statuses.items()))}")
    print(f"per operation: {dict(per_operation)}")
    assert not [code for code in statuses if code >= 500]
    assert total >= 1000
    assert statuses[202] > 0 and statuses[404] > 0 and statuses[422] > 0


@pytest.mark.heavy
def test_schema_fuzzing_with_a_viewer_token_writes_nothing(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    """Every operation, fuzzed with a viewer's token: no write succeeds (each is a 403),
    and afterwards the store holds no request, no autopilot and no new identity."""
    running = add_run(store, simulate(50, {7}), name="running")
    viewer = create_identity(store, "watcher", Role.VIEWER, by="test").token
    settings_ = Settings(
        db=db_url, token=SecretStr(TOKEN), token_file=tmp_path / "token", allowed_hosts="testserver"
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(settings_))
    statuses: Counter[tuple[str, int]] = Counter()
    for operation in (result.ok() for result in schema.get_all_operations()):
        if operation.path.endswith("/stream"):
            continue  # a live stream never ends; the role matrix covers it
        fixed = {"run": running} if "{run}" in operation.path else None

        @settings(
            max_examples=10,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(path_parameters=fixed))
        def exchange(case: Any) -> None:
            heartbeat(store, running)
            response = case.call(headers=auth(viewer), timeout=10)
            assert response.status_code < 500, (case.method, case.path, response.text)
            if case.method.upper() != "GET" and case.path != "/api/tickets":
                assert response.status_code == 403, (case.method, case.path, response.text)
            statuses[case.method.upper(), response.status_code] += 1

        exchange()
    print(f"\nschemathesis as a viewer: {dict(statuses)}")
    assert control_history(store, running) == []
    assert get_autopilot(store, running) is None
    assert [row.name for row in list_identities(store)] == ["watcher"]
    assert sum(n for (method, _), n in statuses.items() if method != "GET") >= 20


def _run_of(case: Any) -> str:
    """The run id in ``case``'s path, as text ('' where it has none)."""
    return str((case.path_parameters or {}).get("run", ""))


# ------------------------------------------------------------ control values against a live scaler

BAD_BODIES: list[tuple[str, str]] = [
    # (raw body, the field the refusal names)
    ('{"scale": NaN}', "scale"),
    ('{"scale": Infinity}', "scale"),
    ('{"scale": -Infinity}', "scale"),
    ('{"growth_factor": NaN}', "growth_factor"),
    ('{"growth_factor": Infinity}', "growth_factor"),
    ('{"backoff_factor": NaN}', "backoff_factor"),
    ('{"min_scale": -Infinity}', "min_scale"),
    ('{"max_scale": Infinity}', "max_scale"),
    ('{"growth_interval": NaN}', "growth_interval"),
    ('{"hysteresis": Infinity}', "hysteresis"),
    (json.dumps({"growth_interval": 10**30}), "growth_interval"),
    (json.dumps({"hysteresis": 10**30}), "hysteresis"),
    (json.dumps({"growth_interval": 2**31}), "growth_interval"),
    (json.dumps({"scale": 10**30 * 10**30}), "scale"),  # a float32 inf once applied
    ('{"scale": 1e39}', "scale"),
    ('{"scale": 5e-324}', "scale"),
    ('{"max_scale": 1e-46}', "max_scale"),
    ('{"max_scale": 1e300}', "max_scale"),
    ('{"scale": 1e400}', "scale"),
    (json.dumps({"growth_interval": -5}), "growth_interval"),
    (json.dumps({"growth_interval": 0}), "growth_interval"),
    (json.dumps({"growth_interval": 2.5}), "growth_interval"),
    (json.dumps({"growth_factor": -2.0}), "growth_factor"),
    (json.dumps({"growth_factor": 1.0}), "growth_factor"),
    (json.dumps({"backoff_factor": -0.5}), "backoff_factor"),
    (json.dumps({"backoff_factor": 1.0}), "backoff_factor"),
    (json.dumps({"backoff_factor": 1e-300}), "backoff_factor"),
    (json.dumps({"scale": -1.0}), "scale"),
    (json.dumps({"scale": 0}), "scale"),
    (json.dumps({"min_scale": -1e-3}), "min_scale"),
    (json.dumps({"hysteresis": -1}), "hysteresis"),
    (json.dumps({"growth_interval": "100"}), "growth_interval"),
    (json.dumps({"scale": "65536"}), "scale"),
    (json.dumps({"growth_factor": "2"}), "growth_factor"),
    (json.dumps({"scale": {"value": 2.0}}), "scale"),
    (json.dumps({"growth_interval": {"$gt": 0}}), "growth_interval"),
    (json.dumps({"scale": [2.0]}), "scale"),
    (json.dumps({"growth_interval": [1, 2]}), "growth_interval"),
    (json.dumps({"scale": None}), "scale"),
    (json.dumps({"growth_interval": None}), "growth_interval"),
    (json.dumps({"scale": True}), "scale"),
    (json.dumps({"growth_interval": False}), "growth_interval"),
    (json.dumps({"hysteresis": True}), "hysteresis"),
    (json.dumps({"growth_interval": 100, "evil": 1}), "evil"),
    (json.dumps({"__proto__": {"scale": 1}}), "__proto__"),
    (json.dumps({"min_scale": 2.0**20, "max_scale": 2.0**10}), "min_scale"),
    (json.dumps({"max_scale": 1.0}), "max_scale"),  # below the scaler's min_scale (16)
]
# Bodies that are no request object at all: refused naming the body.
NOT_AN_OBJECT = ["[]", "[1, 2]", "null", "true", "42", '"scale"', "{}"]


class LiveScaler:
    """A real GradScaler with telemetry, and torch's scaler beside it on the same gradients,
    stepping in a thread until stopped (600 steps at most). The scale never comes near
    ``min_scale``, so torch's sequence is the reference."""

    def __init__(self, url: str) -> None:
        kwargs: dict[str, Any] = {"init_scale": 2.0**10, "growth_interval": 3}
        self.ours = scalewatch.GradScaler(
            "cpu", min_scale=16.0, telemetry=url, run_name="live", **kwargs
        )
        self.torch = torch.amp.GradScaler("cpu", **kwargs)
        self.pairs = [(self._model(), self.ours), (self._model(), self.torch)]
        self.trace: list[tuple[float, float, dict[str, Any]]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.step(1)
        self.ours.flush()
        self.run_id = self.ours.run_id
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def step(self, step: int) -> None:
        data = torch.randn(6, 4, generator=torch.Generator().manual_seed(step))
        for (model, opt), gs in self.pairs:
            opt.zero_grad()
            gs.scale(model(data).pow(2).mean()).backward()
            if step % 7 == 0:
                model[0].weight.grad.view(-1)[0] = float("inf")
            gs.step(opt)
            gs.update()
        self.trace.append((self.ours.get_scale(), self.torch.get_scale(), self.state()))

    def state(self) -> dict[str, Any]:
        return {**self.ours.control_state(), "version": self.ours._control_version}

    def _loop(self) -> None:
        try:
            for step in range(2, 602):
                if self.stop.is_set():
                    return
                self.step(step)
                time.sleep(0.005)
        except BaseException as error:  # reported by the test
            self.error = error

    def __enter__(self) -> LiveScaler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.ours.close()


def test_bad_control_values_are_refused_and_the_live_scaler_keeps_its_state(
    db_url: str, tmp_path: Path
) -> None:
    settings_ = Settings(db=db_url, token=SecretStr(TOKEN), token_file=tmp_path / "token")
    live = LiveScaler(db_url)
    before = live.state()
    with (
        live,
        TestClient(create_app(settings_), raise_server_exceptions=False, base_url=LOCAL) as client,
    ):
        path = f"/api/runs/{live.run_id}/control"
        json_auth = {**auth(), "Content-Type": "application/json"}
        for body, field in BAD_BODIES:
            response = client.post(path, content=body, headers=json_auth)
            assert response.status_code == 422, (body, response.text)
            detail = response.json()["detail"]
            assert any(field in error["loc"] for error in detail), (body, detail)
            assert all(error["msg"] for error in detail), (body, detail)
        for body in NOT_AN_OBJECT:
            response = client.post(path, content=body, headers=json_auth)
            assert response.status_code == 422, (body, response.text)
            assert response.json()["detail"], body
        # Not JSON, or not said to be JSON: refused, naming the body.
        for body, headers in [
            ("growth_interval=5", {**auth(), "Content-Type": "application/x-www-form-urlencoded"}),
            ('{"growth_interval": 5}', {**auth(), "Content-Type": "text/plain"}),
            ("{growth_interval: 5", json_auth),
        ]:
            response = client.post(path, content=body.encode("latin-1"), headers=headers)
            assert response.status_code == 422, (body, response.text)
            assert response.json()["detail"][0]["loc"][0] == "body"
        # Bytes that are not UTF-8, an integer too long for Python to parse (over 4300
        # digits): 400, not a crash.
        for raw in (b"\x00\xff\xfe", b'{"scale": 1' + b"0" * 5000 + b"}"):
            response = client.post(path, content=raw, headers=json_auth)
            assert response.status_code == 400, (raw[:20], response.text)
            assert "parsing the body" in response.json()["detail"]
        # Several MB: refused by its Content-Length, or while streaming when it has none.
        big = b'{"scale": 2.0, "pad": "' + b"x" * 8_000_000 + b'"}'
        response = client.post(path, content=big, headers=json_auth)
        assert response.status_code == 413 and "65536" in response.json()["detail"]
        chunks = iter([big[i : i + 65536] for i in range(0, len(big), 65536)])
        response = client.post(path, content=chunks, headers=json_auth)
        assert response.status_code == 413
        # Nothing was stored, so nothing can be applied; and a request that slipped in
        # would be applied within a step or two of the control poller's next poll (5 a
        # second): the scaler steps on for 100 steps (over 0.5 s at its pace) first.
        with open_store(db_url) as store:
            assert control_history(store, live.run_id) == []
        seen = len(live.trace)
        wait_for(
            lambda: len(live.trace) >= seen + 100 or not live.thread.is_alive(),
            60,
            "the live scaler to step on past the control poller's next polls",
        )
    assert live.error is None
    steps = len(live.trace)
    assert steps >= 50, "the scaler barely stepped while the requests came in"
    assert [ours for ours, _, _ in live.trace] == [ref for _, ref, _ in live.trace]
    assert all(state == before for _, _, state in live.trace)
    with open_store(db_url) as store:
        assert control_history(store, live.run_id) == []


# ------------------------------------------------------------ auth and token leaks


def mutating_routes(client: TestClient, run_id: int) -> list[tuple[str, str]]:
    schema = client.get("/openapi.json").json()
    return [
        (method.upper(), path.replace("{run}", str(run_id)).replace("{name}", "probe"))
        for path, operations in schema["paths"].items()
        for method in operations
        # A stream ticket is a read's: open where reads are (loopback, here).
        if method.upper() not in ("GET", "HEAD", "OPTIONS") and path != "/api/tickets"
    ]


def wrong_authorizations() -> list[dict[str, str]]:
    one_byte_off = TOKEN[:-1] + ("x" if TOKEN[-1] != "x" else "y")
    middle_off = TOKEN[:10] + chr(ord(TOKEN[10]) ^ 1) + TOKEN[11:]
    return [
        {},
        auth("wrong"),
        auth(one_byte_off),
        auth(middle_off),
        auth(TOKEN + "x"),
        auth(TOKEN[:-1]),
        auth(""),
        auth(TOKEN, scheme="Basic"),
        auth(TOKEN, scheme="Token"),
        {"Authorization": TOKEN},
        {"Authorization": f"Bearer{TOKEN}"},
        {"X-Token": TOKEN},
        {"Cookie": f"token={TOKEN}"},
    ]


OPENING = {
    "uid": "cd" * 16,
    "name": "job",
    "world_size": 1,
    "config": {},
    "control": {},
    "started_at": 1.0,
    "host": "node",
    "pid": 1,
    "torch_version": "2.9",
}


def test_every_mutating_route_needs_the_exact_token(client: TestClient, store: Store) -> None:
    run_id = add_run(store, simulate(20, {5}))
    control, autopilot = f"/api/runs/{run_id}/control", f"/api/runs/{run_id}/autopilot"
    accepted = {  # each mutating route: a body it takes, and its answer with the token
        ("POST", control): ({"growth_interval": 5}, 202),
        ("PUT", autopilot): ({"enabled": True, "target_skip_rate": 0.01}, 200),
        ("DELETE", autopilot): (None, 200),
        ("POST", "/api/tokens"): ({"name": "probe", "role": "viewer"}, 201),
        ("DELETE", "/api/tokens/probe"): (None, 200),
        ("POST", "/api/ingest/runs"): (OPENING, 200),  # an admin may do what a writer may
        ("POST", f"/api/ingest/runs/{run_id}/batches"): ({"sequence": 1}, 200),
    }
    routes = mutating_routes(client, run_id)
    assert sorted(routes) == sorted(accepted)
    # Every wrong token of every route from one client: a lockout would answer 429 before
    # the token is looked at (the penalty's own tests say when it does).
    client.app.state.services.penalty = FailurePenalty(free_failures=10**9)  # type: ignore[attr-defined]
    for method, path in sorted(routes, key=lambda route: route[0] == "DELETE"):  # made first
        body, status = accepted[(method, path)]
        before = (control_history(store, run_id), get_autopilot(store, run_id))
        for headers in wrong_authorizations():
            response = client.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
        assert (control_history(store, run_id), get_autopilot(store, run_id)) == before
        # The right token: done.
        assert client.request(method, path, json=body, headers=auth()).status_code == status


def test_no_answer_leaks_the_token(client: TestClient, store: Store) -> None:
    run_id = add_run(store, simulate(40, {5}), name="leak-check")
    client.post(f"/api/runs/{run_id}/control", json={"growth_interval": 7}, headers=auth())
    finished = add_run(store, simulate(5, set()))
    end_run(store, finished)
    schema = client.get("/openapi.json").json()
    paths = ["/", "/run.html", "/docs", "/openapi.json", "/metrics", "/healthz"]
    for path, operations in schema["paths"].items():
        if "get" in operations and not path.endswith("/stream"):
            paths += [path.replace("{run}", str(run_id)), path.replace("{run}", "999")]
    paths += [
        f"/api/runs/{finished}/stream",
        f"/api/runs/{run_id}/steps?start=9&end=3",
        f"/api/runs/{run_id}/export?format=jsonl",
        "/api/runs/abc",
        "/no/such/page",
    ]
    answers = [client.get(path, headers=auth()) for path in paths]
    answers += [client.get(path) for path in paths]
    control = f"/api/runs/{run_id}/control"
    answers += [
        client.post(control, json={"scale": -1}, headers=auth()),
        client.post(control, json={"scale": 2.0}, headers=auth(TOKEN[:-1] + "?")),
        client.post(control, json={"scale": 2.0}, headers=auth(TOKEN, scheme="Basic")),
        client.post(f"/api/runs/{finished}/control", json={"scale": 2.0}, headers=auth()),
        client.post(control, content=b"x" * 100_000, headers=auth()),
    ]
    assert {answer.status_code for answer in answers} >= {200, 401, 404, 409, 413, 422}
    for answer in answers:
        assert TOKEN not in answer.text, answer.request.url
        assert all(TOKEN not in value for value in answer.headers.values()), answer.request.url


# ------------------------------------------------------------ escaping

PAYLOADS = [
    "<img src=x onerror=alert(1)>",
    "<script>alert('x')</script>",
    '"><svg onload=alert(1)>',
    "{{7*7}} ${7*7} </title><b>",
]


def test_user_text_comes_back_verbatim_as_json(client: TestClient, store: Store) -> None:
    """No HTML is rendered on the server; the dashboard's escaping of the same payloads is
    tests/web/test_browser_dashboard.py."""
    ids = {
        create_run(store, name=name, world_size=1, config={"note": name}, control=CONTROL).id: name
        for name in PAYLOADS
    }
    listing = client.get("/api/runs")
    assert listing.headers["content-type"] == "application/json"
    assert {run["id"]: run["name"] for run in listing.json()["runs"]} == ids
    for run_id, name in ids.items():
        detail = client.get(f"/api/runs/{run_id}")
        assert detail.headers["content-type"] == "application/json"
        assert detail.json()["name"] == name and detail.json()["config"] == {"note": name}
        export = client.get(f"/api/runs/{run_id}/export")
        disposition = export.headers["content-disposition"]
        assert "<" not in disposition and ">" not in disposition.replace('"', "")
    metrics = client.get("/metrics").text
    assert 'run_name="<img src=x onerror=alert(1)>"' in metrics
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")
