"""What the browser tests do on the run page: open a run, zoom its chart, read the chart.

open_run(tab, run_id)
zoom(tab, 50, 150)
first = chart(tab, "gd.data[2].x[0]")
"""

from __future__ import annotations

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
