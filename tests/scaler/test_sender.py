"""The sender (scalewatch.telemetry._sender): a job recording through the service posts
the steps that gathered for ``send_interval_s``, fewer and larger posts than the store's
writer makes, each step within that interval of being taken."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scalewatch._control.inbox import ControlInbox
from scalewatch.store.step_rows import COLUMNS
from scalewatch.telemetry import Telemetry, TelemetrySettings, _sender
from tests._helpers.waiting import wait_for
from tests.scaler.test_writer import sample

RATE = 100  # steps a second, as the recorder hands them over
SECONDS = 2.0


class Service:
    """The ingest routes as the service answers them, noting when each post's steps came
    and how they came (``kinds``). It names ``columns`` as its step rows' (None: none, as
    a service older than rows), and refuses rows once it has taken ``rows_until`` posts
    of them (as a service restarted with other columns would)."""

    def __init__(
        self,
        columns: tuple[str, ...] | None = COLUMNS,
        rows_until: int | None = None,
    ) -> None:
        self.columns, self.rows_until = columns, rows_until
        self.away = False  # every batch answered 503 while set
        self.posts: list[tuple[float, list[int]]] = []
        self.kinds: list[tuple[int, str]] = []  # (the batch's number, how its steps came)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/runs"):
            opened = {"id": 1, "uid": body["uid"], "sequence": 0}
            if self.columns is not None:
                opened["step_columns"] = list(self.columns)
            return httpx.Response(200, json=opened)
        if self.away:
            return httpx.Response(503, json={"detail": "the store is away"})
        kinds = {i["kind"] for i in body["items"]} & {"steps", "step_rows"}
        for item in body["items"]:
            if item["kind"] == "step_rows":  # as the service checks them
                columns = self.columns or ()
                assert tuple(item["columns"]) == columns
                assert all(len(row) == len(columns) for row in item["rows"])
        if "step_rows" in kinds:
            taken = sum(kind == "step_rows" for _, kind in self.kinds)
            if self.rows_until is not None and taken >= self.rows_until:
                return httpx.Response(422, json={"detail": "not this service's columns"})
        steps = [s["step"] for i in body["items"] if i["kind"] == "steps" for s in i["steps"]]
        steps += [r[0] for i in body["items"] if i["kind"] == "step_rows" for r in i["rows"]]
        if steps:
            self.posts.append((time.monotonic(), steps))
            self.kinds += [(body["sequence"], kind) for kind in kinds]
        return httpx.Response(
            200, json={"sequence": body["sequence"], "stored": True, "control": []}
        )


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    yield _serving(Service(), monkeypatch)


def _serving(served: Service, monkeypatch: pytest.MonkeyPatch) -> Service:
    """``served`` answering the senders made from now on."""
    client = _sender.ServiceClient

    def answered_by_it(url: str, **_: Any) -> _sender.ServiceClient:
        return client(url, transport=httpx.MockTransport(served))

    monkeypatch.setattr(_sender, "ServiceClient", answered_by_it)
    return served


def _job(settings: TelemetrySettings, service: Service) -> dict[int, float]:
    """Steps taken at ``RATE`` for ``SECONDS``: when each was handed over."""
    telemetry = Telemetry(
        settings, name="sent", world_size=1, config={}, control={}, inbox=ControlInbox()
    )
    taken: dict[int, float] = {}
    try:
        began = time.monotonic()
        for step in range(1, int(RATE * SECONDS) + 1):
            time.sleep(max(0.0, began + step / RATE - time.monotonic()))
            taken[step] = time.monotonic()
            telemetry.submit([sample(step)])
        posted = lambda: sum(len(steps) for _, steps in service.posts)  # noqa: E731
        wait_for(lambda: posted() == len(taken), 30, "every step posted")
    finally:
        telemetry.close()
    return taken


def test_a_job_posts_the_steps_of_its_send_interval_at_once(
    service: Service, tmp_path: Path
) -> None:
    settings = TelemetrySettings("http://service.invalid", writer="thread", spool_dir=str(tmp_path))
    assert settings.send_interval_s == 0.5 > settings.coalesce_s
    taken = _job(settings, service)

    assert [s for _, steps in service.posts for s in steps] == sorted(taken)  # each once
    # 2 s of steps in about 4 posts (10 at the store writer's 0.2 s), none held past the
    # interval by more than a busy machine's delay.
    assert len(service.posts) <= SECONDS / settings.send_interval_s + 2
    waited = max(at - taken[s] for at, steps in service.posts for s in steps)
    assert waited < settings.send_interval_s + 0.5


def test_a_shorter_send_interval_posts_more_often(service: Service, tmp_path: Path) -> None:
    settings = TelemetrySettings(
        "http://service.invalid", writer="thread", spool_dir=str(tmp_path), send_interval_s=0.1
    )
    _job(settings, service)
    assert len(service.posts) >= SECONDS / 0.5 + 3


@pytest.mark.parametrize(
    ("columns", "sent_as"),
    [
        (COLUMNS, "step_rows"),
        (None, "steps"),
        ((*COLUMNS, "a_later_field"), "steps"),
        (tuple(c for c in COLUMNS if c != "grad_norm_spike"), "step_rows"),
    ],
    ids=["its-columns", "a-service-before-rows", "a-newer-service", "an-older-service"],
)
def test_steps_go_as_rows_only_to_a_service_that_names_their_columns(
    columns: tuple[str, ...] | None,
    sent_as: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A service that names the job's columns, or some of them (older than the job: the
    job's newer fields are left out of its rows), takes rows; one that names none, or a
    column the job's steps lack (newer than the job), takes objects."""
    service = _serving(Service(columns), monkeypatch)
    settings = TelemetrySettings("http://service.invalid", writer="thread", spool_dir=str(tmp_path))
    taken = _job(settings, service)
    assert [s for _, steps in service.posts for s in steps] == sorted(taken)
    assert {kind for _, kind in service.kinds} == {sent_as}


def test_rows_a_restarted_service_refuses_are_sent_again_as_objects(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The service takes two posts of rows, then refuses rows (restarted with other
    columns): the refused batch is posted again as objects under its number, and so is
    every later one; every step is stored once, none dropped."""
    service = _serving(Service(rows_until=2), monkeypatch)
    settings = TelemetrySettings(
        "http://service.invalid", writer="thread", spool_dir=str(tmp_path), send_interval_s=0.2
    )
    taken = _job(settings, service)
    assert [s for _, steps in service.posts for s in steps] == sorted(taken)
    numbers = [number for number, _ in service.kinds]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # none skipped
    assert [kind for _, kind in service.kinds][:3] == ["step_rows", "step_rows", "steps"]
    assert {kind for _, kind in service.kinds[2:]} == {"steps"}
    assert "refused steps as rows" in caplog.text


def test_steps_spooled_while_the_service_is_away_are_spooled_as_objects(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A service that takes rows stores the first 20 steps, then is away: the batches
    spooled meanwhile hold their steps as objects, which a service of any kind takes when
    they are sent on."""
    service = _serving(Service(), monkeypatch)
    settings = TelemetrySettings(
        "http://service.invalid", writer="thread", spool_dir=str(tmp_path), send_interval_s=0.2
    )
    telemetry = Telemetry(
        settings, name="sent", world_size=1, config={}, control={}, inbox=ControlInbox()
    )
    spooled = lambda: list(tmp_path.glob("*/batches*"))  # noqa: E731
    try:
        posted = lambda: [s for _, steps in service.posts for s in steps]  # noqa: E731
        for step in range(1, 41):
            telemetry.submit([sample(step)])
            if step == 20:
                wait_for(lambda: len(posted()) == 20, 30, "20 steps posted")
                service.away = True
        wait_for(lambda: bool(spooled()), 30, "batches spooled")
    finally:
        telemetry.close()
    assert {kind for _, kind in service.kinds} == {"step_rows"}
    bodies = [json.loads(line) for path in spooled() for line in path.read_text().splitlines()]
    kinds = {item["kind"] for body in bodies for item in body["items"]} - {"gap"}
    assert kinds == {"steps"}
    posted = [s for _, steps in service.posts for s in steps]
    spooled_steps = [
        s["step"] for b in bodies for i in b["items"] if i["kind"] == "steps" for s in i["steps"]
    ]
    assert sorted(posted + spooled_steps) == list(range(1, 41))
