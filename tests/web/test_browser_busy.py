"""The run page on a busy service, in headless Chromium: a chart answered "busy" (503,
Retry-After) is asked again for coarser buckets and the page says so; a live stream's
``event: coalesced`` has the skipped steps read back from the store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from scalewatch.store import runs
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.records import step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

BUSY = json.dumps({"detail": "busy: no chart query could start within 1 s; ask again shortly"})


def _run(served: Served, steps: int) -> int:
    run = runs.create_run(served.store, name="busy", world_size=1, config={}, control={})
    records = [
        step_record(step, scale=65536.0, growth_tracker=step % 2000) for step in range(1, steps + 1)
    ]
    runs.write_steps(served.store, run.id, records)
    return run.id


def _max_points(url: str) -> int:
    return int(parse_qs(urlsplit(url).query)["max_points"][0])


def test_a_busy_answer_is_asked_again_coarser_and_the_page_says_so(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    run = _run(served, 5000)
    asked: list[int] = []

    def steps(route: Any) -> None:
        asked.append(_max_points(route.request.url))
        if len(asked) == 1:
            route.fulfill(
                status=503,
                headers={"Retry-After": "1", "Content-Type": "application/json"},
                body=BUSY,
            )
        else:
            route.continue_()

    page.route(f"**/api/runs/{run}/steps?*", steps)
    page.goto(f"/run.html?run={run}")
    page.wait_for_function("Number(document.getElementById('chart').dataset.points) > 0")
    info = page.locator("#chart-info[data-busy='1']")
    info.wait_for()
    assert "busy, showing coarser data" in info.inner_text()
    assert len(asked) >= 2 and asked[1] == round(asked[0] / 4)
    assert tab.unexpected_errors(503) == []


def test_a_coalesced_event_reads_the_skipped_steps_back_from_the_store(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    run = _run(served, 3000)
    asked: list[str] = []
    page.route(
        f"**/api/runs/{run}/steps?*",
        lambda route: (asked.append(route.request.url), route.continue_()),
    )
    sent: list[str] = []

    def stream(route: Any) -> None:
        sent.append(route.request.url)
        body = "retry: 600000\n\n" + (
            'id: 2900\nevent: coalesced\ndata: {"after":2000,"to":2900}\n\n'
            if len(sent) == 1
            else ""
        )
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)

    page.route(f"**/api/runs/{run}/stream*", stream)
    page.goto(f"/run.html?run={run}")
    page.locator("#live[data-coalesced='900']").wait_for()
    # The chart reads its view again from the store, after the stream opened.
    deadline = time.monotonic() + 10
    while len(asked) < 2:
        assert time.monotonic() < deadline, asked
        page.wait_for_timeout(50)  # lets the page run and its requests reach the route
    assert tab.unexpected_errors() == []
