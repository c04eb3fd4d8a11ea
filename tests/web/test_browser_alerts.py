"""Alerts on the dashboard: the run page's banner and chart bands, the runs page's column,
raised by the real service's evaluator over a run written as the test goes."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scalewatch.store import StepRecord, runs
from scalewatch.store.alerts import Firing, fire_alert, resolve_alert
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.pages import open_run, zoom
from tests._helpers.records import step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")


def _steps(first: int, last: int, *, low_from: int, skipped: range) -> list[StepRecord]:
    """Steps of now; the scale 0.5 (under the default floor of 1) from ``low_from`` on."""
    now = time.time()
    records = []
    for step in range(first, last + 1):
        scale = 0.5 if step > low_from else 1024.0
        after = 0.5 if step >= low_from else 1024.0
        records.append(
            step_record(
                step,
                wall_time=now,
                scale=scale,
                overflow=step in skipped,
                inf_ranks=(0,) * (step in skipped),
                scale_after=after,
            )
        )
    return records


def _alerts_when(served: Served, run_id: int, done: Callable[[list[Any]], bool]) -> list[Any]:
    """The run's alerts once ``done`` holds for them (the service evaluates every second)."""
    deadline = time.monotonic() + 30
    while True:
        url = f"{served.base_url}/api/runs/{run_id}/alerts"
        with urllib.request.urlopen(url, timeout=5) as response:
            alerts: list[Any] = json.load(response)["alerts"]
        if done(alerts):
            return alerts
        assert time.monotonic() < deadline, f"the alerts of run {run_id} are still {alerts}"
        time.sleep(0.1)


def test_firing_alerts_show_in_a_banner_and_every_alert_on_the_chart_and_the_runs_page(
    tab: Tab, served: Served
) -> None:
    run = runs.create_run(served.store, name="alerting", world_size=1, config={}, control={})
    runs.write_steps(served.store, run.id, _steps(1, 40, low_from=30, skipped=range(0)))
    _alerts_when(served, run.id, lambda alerts: any(a["rule"] == "scale_below" for a in alerts))
    # Watched now: 12 skipped steps in a row fire skip_streak (10) at 59; it resolves at 62.
    runs.write_steps(served.store, run.id, _steps(41, 80, low_from=30, skipped=range(50, 62)))
    alerts = _alerts_when(
        served, run.id, lambda alerts: any(a["state"] == "resolved" for a in alerts)
    )
    ids = {a["rule"]: a["id"] for a in alerts}
    assert set(ids) == {"scale_below", "skip_streak"}

    page = tab.page
    open_run(tab, run.id)
    banner = page.locator("#alerts-banner[data-count='1']")
    banner.wait_for()
    assert page.locator("#alerts-title").inner_text() == "1 alert firing"
    (line,) = page.locator("#alerts-firing li").all_inner_texts()
    assert line == "scale_below (scale_below) since step 30: scale 0.5 (threshold 1)"
    page.wait_for_function("document.getElementById('chart').dataset.alertMarkers === '2'")
    bands = page.evaluate(
        """() => document.getElementById('chart').layout.shapes
            .filter((s) => s.name && s.name.startsWith('alert-'))
            .map((s) => [s.name, s.x0, s.x1])"""
    )
    assert sorted(bands) == sorted(
        [[f"alert-{ids['scale_below']}", 30, 80], [f"alert-{ids['skip_streak']}", 59, 62]]
    )

    page.goto("/")
    cell = page.locator(f'#runs tbody tr[data-run-id="{run.id}"] td[data-label="Alerts"]')
    cell.wait_for()
    page.wait_for_function(
        f"""document.querySelector('#runs tr[data-run-id="{run.id}"] td[data-label="Alerts"]')
            .dataset.firing === '1'"""
    )
    assert cell.inner_text() == "1"
    assert cell.get_attribute("title") == "Firing: scale_below"
    ended = next(iter(served.other_runs.values()))  # finished before the service started
    quiet = page.locator(f'#runs tbody tr[data-run-id="{ended}"] td[data-label="Alerts"]')
    assert quiet.inner_text() == "\u2013"
    assert tab.unexpected_errors() == []


def test_neighbouring_alert_bands_do_not_print_their_labels_over_each_other(
    tab: Tab, served: Served
) -> None:
    """Two bands a few steps apart printed "rank_ho⚠spot": the second label began inside
    the first's text. One of them keeps its label until zoomed in; both keep their bands."""
    run = runs.create_run(served.store, name="neighbours", world_size=2, config={}, control={})
    runs.write_steps(served.store, run.id, _steps(1, 1000, low_from=2000, skipped=range(0)))
    runs.end_run(served.store, run.id)
    for rule, kind, step in (("rank_hotspot", "rank_hotspot", 300), ("skips", "skip_rate", 320)):
        firing = Firing(run.id, rule, kind, 0.6, 0.61, "", step, time.time())
        fired = fire_alert(served.store, firing)
        assert fired is not None
        resolve_alert(served.store, fired.id, step=step + 10, at=time.time(), value=0.5)

    page = tab.page
    open_run(tab, run.id)
    page.wait_for_function("document.getElementById('chart').dataset.alertMarkers === '2'")
    # A view where the two bands' starts are 60 px apart: more than the 36 px that kept
    # labels apart, less than "⚠ rank_hotspot" is wide.
    plot_px = page.evaluate("document.getElementById('chart')._fullLayout.xaxis._length")
    zoom(tab, 250, 250 + round(20 * plot_px / 60))
    assert _alert_labels(page) == ["\u26a0 rank_hotspot"]
    zoom(tab, 290, 340)  # zoomed in: both, clear of each other
    labels = _alert_labels(page, count=2)
    assert sorted(labels) == ["\u26a0 rank_hotspot", "\u26a0 skips"]
    boxes = sorted(
        page.evaluate(
            """[...document.querySelectorAll('#chart g.annotation')]
                .filter((g) => g.textContent.includes('\u26a0'))
                .map((g) => { const r = g.getBoundingClientRect(); return [r.left, r.right]; })"""
        )
    )
    assert boxes[0][1] <= boxes[1][0], boxes
    assert tab.unexpected_errors() == []


def _alert_labels(page: Any, count: int | None = None) -> list[str]:
    """The alert labels the chart shows, once there are ``count`` of them (else any)."""
    shown = (
        "[...document.querySelectorAll('#chart g.annotation')]"
        ".filter((g) => g.textContent.includes('\u26a0'))"
    )
    wanted = f"=== {count}" if count is not None else "> 0"
    page.wait_for_function(f"{shown}.length {wanted}")
    texts: list[str] = page.evaluate(f"{shown}.map((g) => g.textContent)")
    return texts
