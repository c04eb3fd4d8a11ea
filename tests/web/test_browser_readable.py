"""What a person reads on each page, in headless Chromium: no literal null, undefined or
NaN, no measured number written with more than 4 significant digits, and no chart label
(an axis' tick, an annotation) printed over another."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from scalewatch.store import runs
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.pages import open_run
from tests._helpers.records import step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

# NaN as a value; as a word ("inf or NaN", a kind "inf, NaN") it is what a person reads.
WORDS = re.compile(r"\b(null|undefined)\b|(?<!inf or )(?<!inf, )\bNaN\b")
# A decimal number standing alone (not part of a version, an address or a name).
DECIMAL = re.compile(r"(?<![\w.])(\d[\d,]*\.\d+)(?![\w.])")
# Every label's box on every chart of the page: annotations (alerts, markers' labels) and
# each axis' tick labels, as drawn.
LABEL_BOXES = """() => [...document.querySelectorAll(
        '.js-plotly-plot .annotation, .js-plotly-plot g[class$="tick"] > text')]
    .map((node) => [node.textContent, node.getBoundingClientRect()])
    .filter(([, r]) => r.width > 0 && r.height > 0)
    .map(([text, r]) => [text, r.left, r.top, r.right, r.bottom])"""


# What the page says, less what is read as a word or exactly on purpose: an overflow's kinds
# ("NaN", "inf + NaN"), and a scale, written to its last digit where it is no power of two
# (another test's run of 65,536.0390625 shares the store).
EXEMPT = '[data-label="Kinds"], [data-label="Current scale"], [data-fact="scale"]'
READ_TEXT = f"""(() => {{
    const exempt = [...document.querySelectorAll('{EXEMPT}')];
    const shown = exempt.map((node) => node.style.display);
    exempt.forEach((node) => {{ node.style.display = 'none'; }});
    const text = document.body.innerText;
    exempt.forEach((node, i) => {{ node.style.display = shown[i]; }});
    return text;
}})()"""


def _significant(number: str) -> int:
    digits = number.replace(",", "").replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." not in number else len(digits)


def _unreadable(text: str) -> list[str]:
    found = [m.group(0) for m in WORDS.finditer(text)]
    found += [m.group(1) for m in DECIMAL.finditer(text) if _significant(m.group(1)) > 4]
    return found


def _overlapping(boxes: list[list[object]]) -> list[tuple[object, object]]:
    """Pairs of labels whose boxes cross by more than a pixel each way, by their texts."""
    out = []
    for i, (text_a, *a) in enumerate(boxes):
        for text_b, *b in boxes[i + 1 :]:
            if a[0] < b[2] - 1 and b[0] < a[2] - 1 and a[1] < b[3] - 1 and b[1] < a[3] - 1:
                out.append((text_a, text_b))
    return out


def test_the_text_helpers_find_what_they_look_for() -> None:
    assert _unreadable("loss null · 0.6930818 · 0.6931 · 1,234.5 · torch 2.13.0 · 12.5%") == [
        "null", "0.6930818", "1,234.5",
    ]  # fmt: skip
    assert _unreadable("inf or NaN · kinds inf, NaN · loss NaN") == ["NaN"]
    boxes = [["a", 0, 0, 10, 10], ["b", 5, 5, 15, 15], ["c", 20, 0, 30, 10]]
    assert _overlapping(boxes) == [("a", "b")]


def _healthy_run(served: Served) -> int:
    """A run as a language model writes it: a gradient norm within a decade (0.4 to 1.6, the
    range whose log axis labelled every minor tick "1"), a decaying learning rate, a falling
    loss, and an overflow every 50 steps."""
    run = runs.create_run(served.store, name="readable", world_size=2, config={}, control={})
    records = [
        step_record(
            step,
            scale=65536.0,
            overflow=step % 50 == 0,
            inf_ranks=(step // 50 % 2,) if step % 50 == 0 else (),
            scale_after=32768.0 if step % 50 == 0 else 65536.0,
            loss=2.5 - step / 400 + 0.05 * math.sin(step),
            lr=0.003 * (1 - step / 500),
            grad_norm=None if step % 50 == 0 else 1.0 + 0.6 * math.sin(step / 7),
        )
        for step in range(1, 401)
    ]
    runs.write_steps(served.store, run.id, records)
    return run.id


@pytest.mark.parametrize("where", ["runs", "run", "run with norm", "compare"])
def test_each_page_reads_as_a_person_reads_it(tab: Tab, served: Served, where: str) -> None:
    page = tab.page
    ended = next(iter(served.other_runs.values()))
    if where == "runs":
        page.goto("/")
        page.locator(f'#runs tbody tr[data-run-id="{served.run_id}"]').wait_for()
    elif where == "compare":
        page.goto(f"/?compare={served.run_id},{ended}")
        page.locator("#compare-chart .legend").wait_for(state="attached")
    else:
        open_run(tab, served.run_id if where == "run" else _healthy_run(served))
        page.locator("[data-fact=steps]").filter(has_not_text="\u2013").wait_for()
    assert _overlapping(page.evaluate(LABEL_BOXES)) == []
    text = page.evaluate(READ_TEXT)
    assert _unreadable(text) == [], text
    assert tab.unexpected_errors() == []
