"""The autopilot's switch and its changes on the chart, in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalewatch.store import control, runs
from scalewatch.store.autopilot import get_autopilot, set_autopilot
from scalewatch.store.states import RequestSource
from tests._helpers.harness import CHROMIUM, HOSTILE_NAME, Served, Tab
from tests._helpers.records import step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")


def open_run(tab: Tab, run_id: int) -> None:
    tab.page.goto(f"/run.html?run={run_id}")
    tab.page.wait_for_function("Number(document.getElementById('chart').dataset.points) > 0")


def test_the_switch_turns_the_autopilot_on_and_off(tab: Tab, served: Served) -> None:
    page = tab.page
    open_run(tab, served.run_id)
    page.locator("#autopilot[data-state=off]").wait_for()
    assert page.get_attribute("#autopilot-switch", "aria-checked") == "false"
    page.fill("#autopilot-target", "150")
    page.click("#autopilot-switch")
    page.locator("#autopilot-error", has_text="the percent of steps it may skip").wait_for()
    page.fill("#autopilot-target", "2")
    page.click("#autopilot-switch")  # no token yet: it asks for one
    page.locator("#token-error", has_text="Enter the access token").wait_for()
    page.fill("#token", served.token)
    page.click("#autopilot-switch")
    page.locator("#autopilot[data-state=watching]").wait_for()
    assert page.get_attribute("#autopilot-switch", "aria-checked") == "true"
    row = get_autopilot(served.store, served.run_id)
    assert row is not None and row.enabled and row.target_skip_rate == 0.02
    page.locator("#autopilot-settings", has_text="Target 2.00%").wait_for()
    # The service's loop decides within a tick or two; the panel shows what and why.
    page.locator("#autopilot-decision", has_text="Last decision:").wait_for(timeout=20_000)
    page.click("#autopilot-switch")
    page.locator("#autopilot[data-state=off]").wait_for()
    row = get_autopilot(served.store, served.run_id)
    assert row is not None and not row.enabled
    assert page.get_attribute("#autopilot-switch", "aria-checked") == "false"
    assert page.evaluate("sessionStorage.getItem('scalewatch.token')") == served.token
    assert tab.unexpected_errors() == []


def test_a_finished_runs_switch_is_disabled(tab: Tab, served: Served) -> None:
    page = tab.page
    open_run(tab, served.other_runs[HOSTILE_NAME])
    page.locator("#control-closed", has_text="This run is finished").wait_for()
    assert page.is_disabled("#autopilot-switch") and page.is_disabled("#autopilot-target")


def test_the_autopilot_of_a_run_that_ends_reads_as_ended_and_its_request_keeps_why(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    state = control.control_state(served.store, served.run_id)
    state.pop("version")
    run = runs.create_run(served.store, name="ending", world_size=1, config={}, control=state)
    interval = state["growth_interval"]
    records = [step_record(step, growth_interval=interval) for step in range(1, 21)]
    runs.write_steps(served.store, run.id, records)
    set_autopilot(served.store, run.id, {"enabled": True, "target_skip_rate": 0.01})
    why = "skipped-step rate 5.00% over 500 steps"
    asked = control.request_control(
        served.store, run.id, {"growth_interval": interval * 2}, requested_by="autopilot",
        source=RequestSource.AUTOPILOT, note=why,
    )  # fmt: skip
    open_run(tab, run.id)
    page.locator("#autopilot[data-state=watching]").wait_for()
    runs.end_run(served.store, run.id)  # the page sees it within a poll of the run
    page.locator("#autopilot[data-state=ended]").wait_for()
    page.locator("#autopilot-state", has_text="Ended with the run").wait_for()
    assert page.is_disabled("#autopilot-switch") and page.is_hidden("#autopilot-reason")
    # Its request, rejected, keeps why it was asked for next to why it was rejected.
    row = page.locator(f"#history tbody tr[data-request-id='{asked.id}'][data-status=rejected]")
    row.wait_for()
    assert f"{why}. Rejected: the run finished first" in row.inner_text()
    assert tab.unexpected_errors() == []


def test_an_autopilot_change_is_marked_on_the_chart_with_its_reason(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    interval = control.control_state(served.store, served.run_id)["growth_interval"]
    request = control.request_control(
        served.store, served.run_id, {"growth_interval": interval}, requested_by="autopilot",
        source=RequestSource.AUTOPILOT, note="skipped-step rate 5.00% over 500 steps",
    )  # fmt: skip
    open_run(tab, served.run_id)
    row = page.locator(f"#history tbody tr[data-request-id='{request.id}'][data-status=applied]")
    row.wait_for(timeout=10_000)
    assert "autopilot" in row.inner_text() and "skipped-step rate 5.00%" in row.inner_text()
    (applied,) = [
        r for r in control.control_history(served.store, served.run_id) if r.id == request.id
    ]
    page.wait_for_function(
        """([name, step]) => {
          const gd = document.getElementById('chart');
          return gd.layout.shapes.some(s => s.name === name && s.x0 === step);
        }""",
        arg=[f"control-{request.id}", applied.applied_step],
    )
    # What its label says (who, why): web/tests/autopilot.test.mjs.
