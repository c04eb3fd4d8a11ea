"""What the browser tests do on the run page: open a run, zoom its chart, read the chart.

open_run(tab, run_id)
zoom(tab, 50, 150)
first = chart(tab, "gd.data[2].x[0]")
detail = click_overflow(tab.page, 100)
"""

from __future__ import annotations

import time

from playwright.sync_api import Locator, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests._helpers.harness import Tab

POINTS = "Number(document.getElementById('chart').dataset.points)"


def open_run(tab: Tab, run_id: int) -> None:
    tab.page.goto(f"/run.html?run={run_id}")
    tab.page.wait_for_function(f"{POINTS} > 0")


def zoom(tab: Tab, start: int, end: int) -> None:
    """Zoom the chart to steps ``start``..``end``, as a drag does, and wait until it is drawn."""
    tab.page.evaluate(
        f"Plotly.relayout(document.getElementById('chart'), {{'xaxis.range': [{start}, {end}]}})"
    )
    tab.page.locator(f"#chart[data-view='{start}-{end}']").wait_for(state="attached")


def chart(tab: Tab, expression: str) -> object:
    return tab.page.evaluate(f"(gd => {expression})(document.getElementById('chart'))")


def click_overflow(page: Page, step: int, timeout_s: float = 30.0) -> Locator:
    """Click the chart's overflow marker of ``step`` where Plotly drew it, until its detail
    is shown (a redraw of the chart between finding the marker and the click, on a busy
    machine, lets a click land where the marker no longer is); the detail's locator."""
    page.wait_for_function(
        f"document.getElementById('chart').data[3].x.includes({step})", timeout=10_000
    )
    detail = page.locator(f"#overflow-detail[data-state=shown][data-step='{step}']")
    deadline = time.monotonic() + timeout_s
    while True:
        x, y = page.evaluate(
            f"""(gd => {{
                const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
                const i = gd.data[3].x.indexOf({step});
                const box = gd.getBoundingClientRect();
                return [box.left + xa._offset + xa.c2p(gd.data[3].x[i]),
                        box.top + ya._offset + ya.c2p(gd.data[3].y[i])];
            }})(document.getElementById('chart'))"""
        )
        page.mouse.move(x, y)
        page.mouse.click(x, y)
        try:
            detail.wait_for(timeout=2_000)
            return detail
        except PlaywrightTimeout:
            if page.get_attribute("#overflow-detail", "data-step") == str(step):
                left_ms = max(1.0, deadline - time.monotonic()) * 1000
                detail.wait_for(timeout=left_ms)  # the click was taken: its answer is slow
                return detail
            if time.monotonic() > deadline:
                raise
