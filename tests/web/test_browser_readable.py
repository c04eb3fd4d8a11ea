"""What a person reads on each page, in headless Chromium: no literal null, undefined or
NaN, no measured number written with more than 4 significant digits, and no chart label
printed over another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.pages import open_run

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

# NaN as a value; as a word ("inf or NaN", a kind "inf, NaN") it is what a person reads.
WORDS = re.compile(r"\b(null|undefined)\b|(?<!inf or )(?<!inf, )\bNaN\b")
# A decimal number standing alone (not part of a version, an address or a name).
DECIMAL = re.compile(r"(?<![\w.])(\d[\d,]*\.\d+)(?![\w.])")
# Every chart label's box, on every chart of the page.
LABEL_BOXES = """() => [...document.querySelectorAll('.js-plotly-plot .annotation')]
    .map((a) => a.getBoundingClientRect())
    .filter((r) => r.width > 0 && r.height > 0)
    .map((r) => [r.left, r.top, r.right, r.bottom])"""


def _significant(number: str) -> int:
    digits = number.replace(",", "").replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." not in number else len(digits)


def _unreadable(text: str) -> list[str]:
    found = [m.group(0) for m in WORDS.finditer(text)]
    found += [m.group(1) for m in DECIMAL.finditer(text) if _significant(m.group(1)) > 4]
    return found


def _overlapping(boxes: list[list[float]]) -> list[tuple[int, int]]:
    return [
        (i, j)
        for i, a in enumerate(boxes)
        for j, b in enumerate(boxes[i + 1 :], i + 1)
        if a[0] < b[2] - 1 and b[0] < a[2] - 1 and a[1] < b[3] - 1 and b[1] < a[3] - 1
    ]


def test_the_text_helpers_find_what_they_look_for() -> None:
    assert _unreadable("loss null · 0.6930818 · 0.6931 · 1,234.5 · torch 2.13.0 · 12.5%") == [
        "null", "0.6930818", "1,234.5",
    ]  # fmt: skip
    assert _unreadable("inf or NaN · kinds inf, NaN · loss NaN") == ["NaN"]
    assert _overlapping([[0, 0, 10, 10], [5, 5, 15, 15], [20, 0, 30, 10]]) == [(0, 1)]


@pytest.mark.parametrize("where", ["runs", "run", "compare"])
def test_each_page_reads_as_a_person_reads_it(tab: Tab, served: Served, where: str) -> None:
    page = tab.page
    ended = next(iter(served.other_runs.values()))
    if where == "runs":
        page.goto("/")
        page.locator(f'#runs tbody tr[data-run-id="{served.run_id}"]').wait_for()
    elif where == "run":
        open_run(tab, served.run_id)
        page.locator("[data-fact=steps]").filter(has_not_text="\u2013").wait_for()
    else:
        page.goto(f"/?compare={served.run_id},{ended}")
        page.locator("#compare-chart .legend").wait_for(state="attached")
    text = page.evaluate("document.body.innerText")
    assert _unreadable(text) == [], text
    assert _overlapping(page.evaluate(LABEL_BOXES)) == []
    assert tab.unexpected_errors() == []
