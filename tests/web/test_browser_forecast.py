"""The run page says where the scale is heading, in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalewatch.store import runs
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.service import simulate

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")


def test_a_collapsing_runs_page_says_when_the_scale_reaches_its_floor(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    run = runs.create_run(served.store, name="collapsing", world_size=1, config={}, control={})
    runs.write_steps(
        served.store, run.id, simulate(1200, set(range(100, 1201, 100)), interval=10**9)
    )
    page.goto(f"/run.html?run={run.id}")
    card = page.locator("#forecast-fact")
    card.wait_for(state="visible")
    assert card.locator("[data-fact=forecast]").inner_text() == (
        "halving every ~100 steps: 1.0 in ~400 steps at this rate (read from steps 1\u20131,200)"
    )
    assert tab.unexpected_errors() == []
