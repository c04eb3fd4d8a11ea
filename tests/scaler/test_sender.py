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
from scalewatch.telemetry import Telemetry, TelemetrySettings, _sender
from tests._helpers.waiting import wait_for
from tests.scaler.test_writer import sample

RATE = 100  # steps a second, as the recorder hands them over
SECONDS = 2.0


class Service:
    """The ingest routes as the service answers them, noting when each post's steps came."""

    def __init__(self) -> None:
        self.posts: list[tuple[float, list[int]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/runs"):
            return httpx.Response(200, json={"id": 1, "uid": body["uid"], "sequence": 0})
        steps = [s["step"] for i in body["items"] if i["kind"] == "steps" for s in i["steps"]]
        if steps:
            self.posts.append((time.monotonic(), steps))
        return httpx.Response(
            200, json={"sequence": body["sequence"], "stored": True, "control": []}
        )


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    served = Service()
    client = _sender.ServiceClient

    def answered_by_it(url: str, **_: Any) -> _sender.ServiceClient:
        return client(url, transport=httpx.MockTransport(served))

    monkeypatch.setattr(_sender, "ServiceClient", answered_by_it)
    yield served


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
