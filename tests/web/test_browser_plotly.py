"""The charts draw with the plotly.js of the installed ``plotly`` package, under the pages'
Content-Security-Policy. ``make lowest`` runs these on the lowest plotly pyproject.toml admits.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scalewatch.app.dashboard import plotly_js_path
from tests._helpers.harness import CHROMIUM, HOSTILE_NAME, Served, Tab

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

BANNER = re.compile(r"plotly\.js v(\S+)")


def _installed_plotly_js() -> str:
    """The plotly.js release that the installed plotly package ships, from its banner."""
    with plotly_js_path().open() as bundle:
        found = BANNER.search(bundle.read(200))
    assert found is not None
    return found[1]


def _served_plotly_js(tab: Tab) -> str:
    response = tab.page.request.get("vendor/plotly.min.js")
    assert response.ok
    found = BANNER.search(response.text()[:200])
    assert found is not None
    return found[1]


def _wait_drawn(tab: Tab, chart: str) -> None:
    """Wait for plotly's first trace in ``chart``; if none comes, say what the page said."""
    try:
        tab.page.locator(f"{chart} .main-svg .scatterlayer .trace").first.wait_for()
    except Exception as error:
        shown = tab.page.locator(".alert:not([hidden])").all_inner_texts()
        raise AssertionError(f"{chart} not drawn; the page said {shown}, {tab.errors}") from error


def test_the_run_chart_draws(strict_tab: Tab, served: Served) -> None:
    page = strict_tab.page
    page.goto(f"/run.html?run={served.run_id}")
    _wait_drawn(strict_tab, "#chart")
    # The first trace can be drawn before the run's series has come back.
    page.locator("#chart:not([data-points='0'])").wait_for()
    assert page.locator("#error").is_hidden()
    assert _served_plotly_js(strict_tab) == _installed_plotly_js()
    assert strict_tab.unexpected_errors() == [] and strict_tab.dialogs == []


def test_the_comparison_chart_draws(strict_tab: Tab, served: Served) -> None:
    ended = served.other_runs[HOSTILE_NAME]
    strict_tab.page.goto(f"/?status=finished&compare={ended}")
    _wait_drawn(strict_tab, f"#compare-chart[data-runs='{ended}']")
    assert strict_tab.unexpected_errors() == [] and strict_tab.dialogs == []
