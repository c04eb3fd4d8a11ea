"""Compare runs on the runs page, in headless Chromium against a real service: the filter,
the choice kept in the URL, and one chart of the chosen runs overlaid by step."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from scalewatch.store import queries
from tests._helpers.harness import CHROMIUM, HOSTILE_NAME, Served, Tab

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

CHART = "document.getElementById('compare-chart')"


def query(tab: Tab) -> dict[str, list[str]]:
    return parse_qs(urlsplit(tab.page.url).query)


def row(tab: Tab, run_id: int) -> object:
    return tab.page.locator(f'#runs tbody tr[data-run-id="{run_id}"]')


def rolling_rate(series: dict[str, list[int]], window: int) -> list[float]:
    """The skipped share of the buckets that end within the last ``window`` steps."""
    last, n, skipped = series["last_step"], series["n"], series["skipped"]
    rates = []
    for i, end in enumerate(last):
        inside = [j for j in range(i + 1) if last[j] > end - window]
        rates.append(sum(skipped[j] for j in inside) / sum(n[j] for j in inside))
    return rates


def drawn(tab: Tab, runs: list[int]) -> None:
    ids = ",".join(map(str, runs))
    tab.page.locator(f"#compare-chart[data-runs='{ids}']").wait_for(state="attached")


def test_filter_choose_and_overlay_runs_kept_in_the_url(tab: Tab, served: Served) -> None:
    page = tab.page
    live, ended = served.run_id, served.other_runs[HOSTILE_NAME]
    page.goto("/")
    row(tab, live).wait_for()  # type: ignore[attr-defined]
    row(tab, ended).wait_for()  # type: ignore[attr-defined]
    assert page.locator("#compare").is_hidden()

    page.select_option("#status-filter", "finished")
    assert row(tab, live).is_hidden() and row(tab, ended).is_visible()  # type: ignore[attr-defined]
    assert query(tab) == {"status": ["finished"]}
    page.select_option("#status-filter", "")
    page.fill("#name-filter", "BERT")
    assert row(tab, live).is_visible() and row(tab, ended).is_hidden()  # type: ignore[attr-defined]
    page.fill("#name-filter", "no run is called this")
    assert page.locator("#no-match").is_visible()
    page.fill("#name-filter", "")
    assert query(tab) == {}

    page.locator(f'#runs tr[data-run-id="{live}"] input.pick').check()
    page.locator(f'#runs tr[data-run-id="{ended}"] input.pick').check()
    assert query(tab) == {"compare": [f"{live},{ended}"]}
    drawn(tab, [live, ended])

    # The scale axis reads powers of two, as the run page's ("7 6 5 4 3 2 10k 9 8" before).
    ticks = page.evaluate(
        f"""({{mode: {CHART}._fullLayout.yaxis.tickmode,
              text: [...{CHART}.querySelectorAll('.ytick text')].map((t) => t.innerHTML)}})"""
    )
    assert ticks["mode"] == "array" and ticks["text"], ticks
    # Plotly writes 2<sup>15</sup> as 2, a zero-width space, then the exponent raised.
    assert all(re.match(r"2\u200b<tspan[^>]*>-?\d+</tspan>", text) for text in ticks["text"]), ticks
    # The finished run's curves are its chart buckets, as the chart query gives them.
    series = queries.chart_series(served.store, ended, max_points=1000).columns
    traces = page.evaluate(
        f"""(group => {CHART}.data.filter(t => t.legendgroup === group).map(t => (
            {{x: Array.from(t.x), y: Array.from(t.y), axis: t.yaxis || 'y', name: t.name}})))"""
        f"('run-{ended}')"
    )
    top, bottom, line, rate = traces
    assert (top["y"], bottom["y"]) == (series["scale_max"], series["scale_min"])
    assert (line["x"], line["y"]) == (series["last_step"], series["scale_last"])
    assert rate["axis"] == "y2"
    window = int(page.get_attribute("#compare-chart", "data-rate-window") or 0)
    assert window == 200  # the run page's window: every bucket here is one step
    assert rate["y"] == pytest.approx(rolling_rate(series, window))
    live_line = page.evaluate(
        f"{CHART}.data.filter(t => t.legendgroup === 'run-{live}' && t.showlegend !== false)"
        ".map(t => t.x.length)"
    )
    assert live_line[0] > 0
    # A run's name is text in the list and in the legend, never markup.
    assert page.locator("#compare-list").inner_text().count(HOSTILE_NAME) == 1
    assert line["name"] == HOSTILE_NAME.replace("<", "&lt;").replace(">", "&gt;") + f" (#{ended})"
    legend = page.evaluate("document.querySelector('#compare-chart .legend').textContent")
    assert HOSTILE_NAME in legend
    assert page.locator("#compare-chart img").count() == 0

    page.reload()  # the URL keeps the choice
    drawn(tab, [live, ended])
    assert page.locator(f'#runs tr[data-run-id="{ended}"] input.pick').is_checked()
    page.get_by_label(f"Remove {HOSTILE_NAME} from the comparison").click()
    drawn(tab, [live])
    assert query(tab) == {"compare": [str(live)]}
    assert not page.locator(f'#runs tr[data-run-id="{ended}"] input.pick').is_checked()
    page.click("#compare-clear")
    assert page.locator("#compare").is_hidden() and query(tab) == {}
    assert tab.dialogs == [] and tab.unexpected_errors() == []


def test_a_shared_link_opens_the_comparison_under_the_pages_policy(
    strict_tab: Tab, served: Served
) -> None:
    ended = served.other_runs[HOSTILE_NAME]
    strict_tab.page.goto(f"/?status=finished&compare={ended}")
    drawn(strict_tab, [ended])
    assert strict_tab.page.locator("#status-filter").input_value() == "finished"
    assert strict_tab.page.locator(f'#runs tr[data-run-id="{served.run_id}"]').is_hidden()
    assert strict_tab.unexpected_errors() == [] and strict_tab.dialogs == []
