"""What a person reads on the pages: the scale as a step function, labels that do not pile
up, one way to write a number or a time, cards on one line, names shown as they are."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from sqlalchemy import update

from scalewatch.store import control, runs
from scalewatch.store.schema import runs as runs_table
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.pages import chart, open_run, zoom
from tests._helpers.records import rising_records, step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

# The scale line's value at step ``x``: the last of its points at or before ``x`` (Plotly's
# "hv" holds each point's value until the next one).
LINE_AT = """(gd, x) => {
    const line = gd.data[2];
    let value = null;
    line.x.forEach((at, i) => { if (at <= x) value = line.y[i]; });
    return value;
}"""
TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


def _local(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _line_at(tab: Tab, step: int) -> object:
    return tab.page.evaluate(f"(x => ({LINE_AT})(document.getElementById('chart'), x))", step)


@pytest.mark.parametrize("zoomed", [False, True], ids=["whole-run", "zoomed"])
def test_the_scale_line_steps_and_meets_each_overflow_marker(
    tab: Tab, served: Served, zoomed: bool
) -> None:
    """The line sloped from step to step and, at an overflow, showed the scale after the
    backoff where the marker showed the scale used."""
    run = runs.create_run(served.store, name="stepping", world_size=1, config={}, control={})
    overflows = frozenset({40, 41, 90})
    records = rising_records(range(1, 121), lambda s: 10 + s // 20 - sum(o < s for o in overflows),
                      overflows)  # fmt: skip
    runs.write_steps(served.store, run.id, records)
    open_run(tab, run.id)
    if zoomed:
        zoom(tab, 30, 100)
    assert chart(tab, "[gd.data[0].line.shape, gd.data[1].line.shape, gd.data[2].line.shape]") == [
        "hv",
        "hv",
        "hv",
    ]
    tab.page.wait_for_function("document.getElementById('chart').data[3].x.length >= 3")
    marked = chart(tab, "gd.data[3].x.map((x, i) => [x, gd.data[3].y[i]])")
    by_step = {r.step: r for r in records}
    assert sorted(x for x, _ in marked) == sorted(overflows)  # type: ignore[union-attr]
    for step, y in marked:  # type: ignore[union-attr]
        assert y == by_step[step].scale
        assert _line_at(tab, step) == y, f"the line at overflow step {step}"
        assert _line_at(tab, step + 1) == by_step[step].scale_after, "the backoff, a step later"
    for step in (35, 60, 99):
        assert _line_at(tab, step) == by_step[step].scale
    assert tab.unexpected_errors() == []


def test_control_labels_thin_out_zoomed_out_and_return_zoomed_in(tab: Tab, served: Served) -> None:
    """Eighty changes two steps apart drew eighty labels on top of one another."""
    run = runs.create_run(served.store, name="tuned", world_size=1, config={}, control={})
    runs.write_steps(served.store, run.id, rising_records(range(1, 2001), lambda s: 16))
    for k in range(80):
        control.record_code_change(served.store, run.id, {"growth_interval": 100 + k},
                                   step=1000 + 2 * k, at=1.0, state={}, version=k + 1)  # fmt: skip
    open_run(tab, run.id)
    page = tab.page
    page.locator("#chart[data-markers='80']").wait_for(state="attached")
    labels = int(page.get_attribute("#chart", "data-labels") or "0")
    assert 1 <= labels <= 5
    zoom(tab, 1000, 1010)
    page.wait_for_function("Number(document.getElementById('chart').dataset.labels) === 6")
    texts = chart(tab, "gd.layout.annotations.map((a) => a.text).filter((t) => t[0] === '#')")
    first = [row.id for row in control.control_history(served.store, run.id)]
    assert sorted(texts) == sorted(f"#{n}" for n in sorted(first)[:6])  # type: ignore[arg-type]
    assert tab.unexpected_errors() == []


def test_a_number_and_a_time_read_the_same_on_every_panel(tab: Tab, served: Served) -> None:
    """The same scale read 65,536.03125, 65,536.039063 and 65536.0390625 on three panels;
    the runs page said "8:20:42 AM" beside "2026-12-01 08:19:21"."""
    scale = 65536.0390625
    run = runs.create_run(served.store, name="odd-scale", world_size=1, config={},
                          control={"scale": scale})  # fmt: skip
    records = [step_record(s, scale=scale, growth_tracker=s) for s in range(1, 11)]
    runs.write_steps(served.store, run.id, records)
    page = tab.page
    page.goto("/")
    cell = page.locator(f'#runs tbody tr[data-run-id="{run.id}"] td[data-label="Current scale"]')
    cell.wait_for()
    page.wait_for_function("document.getElementById('updated').textContent.startsWith('Updated')")
    updated = page.inner_text("#updated")
    assert TIME.match(updated.removeprefix("Updated ").split(" · ")[0]), updated
    shown = "65,536.0390625"
    assert cell.inner_text() == shown

    open_run(tab, run.id)
    page.locator("[data-fact=scale]", has_text=shown).wait_for()
    assert page.inner_text("[data-fact=scale]") == shown
    assert page.inner_text("[data-state=scale]") == shown
    assert page.get_attribute("#f-scale", "placeholder") == f"now {shown}"
    hover = chart(tab, "gd.data[2].customdata.map((c) => c[0])")
    assert set(hover) == {shown}  # type: ignore[arg-type]
    started = page.inner_text("[data-fact=started_at]")
    assert TIME.match(started), started
    assert tab.unexpected_errors() == []


@pytest.mark.parametrize("width", [1280, 390], ids=["desktop", "phone"])
def test_the_fact_cards_hold_each_value_on_one_line(tab: Tab, served: Served, width: int) -> None:
    run = runs.create_run(served.store, name="cards", world_size=1, config={}, control={})
    with served.store.write() as conn:
        conn.execute(
            update(runs_table)
            .where(runs_table.c.id == run.id)
            .values(host="node-0042.example.org", pid=4_194_304)
        )
    runs.write_steps(served.store, run.id, rising_records(range(1, 11), lambda s: 16))
    tab.page.set_viewport_size({"width": width, "height": 900})
    open_run(tab, run.id)
    tab.page.locator("[data-fact=host]", has_text="node-0042").wait_for()
    # The cards shown: one hidden for this run (its LR schedule: none registered) has no
    # line to hold.
    lines = tab.page.evaluate(
        """() => [...document.querySelectorAll('.facts dd')]
            .filter((dd) => dd.offsetParent !== null)
            .map((dd) => {
            const range = document.createRange();
            range.selectNodeContents(dd);
            const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
            return [dd.dataset.fact, tops.size, dd.scrollWidth <= dd.clientWidth];
        })"""
    )
    assert [fact for fact, rows, fits in lines if rows != 1 or not fits] == []
    assert "host" in [fact for fact, _, _ in lines] and "schedule" not in [f for f, _, _ in lines]
    assert tab.unexpected_errors() == []


def test_a_bidi_override_in_a_run_name_is_shown_not_obeyed(tab: Tab, served: Served) -> None:
    """U+202E in a name reversed the text after it: "report\u202efdp.exe" read as
    "reportexe.pdf" on both pages."""
    name = "report\u202efdp.exe"
    shown = "report<U+202E>fdp.exe"
    run = runs.create_run(served.store, name=name, world_size=1, config={}, control={})
    runs.write_steps(served.store, run.id, rising_records(range(1, 11), lambda s: 16))
    page = tab.page
    page.goto("/")
    link = page.locator(f'#runs tbody tr[data-run-id="{run.id}"] a')
    link.wait_for()
    assert link.inner_text() == shown
    assert link.get_attribute("aria-label") == f"Open run {shown}"
    open_run(tab, run.id)
    page.locator("#run-name", has_text=shown).wait_for()
    assert page.title() == f"{shown} · scalewatch"
    assert tab.unexpected_errors() == []


def test_the_runs_page_shows_when_each_run_started_and_ended_and_for_how_long(
    tab: Tab, served: Served
) -> None:
    run = runs.create_run(served.store, name="timed", world_size=1, config={}, control={})
    # Its scale under 1 (2^-12), the widest a scale is written: the column stays in view.
    runs.write_steps(served.store, run.id, rising_records(range(1, 3), lambda s: -12))
    runs.end_run(served.store, run.id)
    started = 1_790_000_000.0
    with served.store.write() as conn:
        conn.execute(
            update(runs_table)
            .where(runs_table.c.id == run.id)
            .values(started_at=started, ended_at=started + 3725, heartbeat_at=started + 3725)
        )
    page = tab.page
    page.goto("/")
    row = page.locator(f'#runs tbody tr[data-run-id="{run.id}"]')
    row.wait_for()
    headers = page.locator("#runs thead th").all_inner_texts()
    assert headers[-4:] == ["Started", "Ended", "Duration", "Last seen"]
    cells = {
        label: row.locator(f'td[data-label="{label}"]').inner_text()
        for label in ("Started", "Ended", "Duration")
    }
    assert cells == {
        "Started": _local(started),
        "Ended": _local(started + 3725),
        "Duration": "1 h 02 min",
    }
    live = page.locator(f'#runs tbody tr[data-run-id="{served.run_id}"] td[data-label="Ended"]')
    assert live.inner_text() == "\u2013"  # the dash of a value not known
    # Beside the columns that never wrap, the names were squeezed to a word a line.
    name = row.locator("td.name").bounding_box()
    assert name is not None and name["width"] >= 140
    wrap = "(w => [w.scrollWidth, w.clientWidth])(document.querySelector('.table-wrap'))"
    scrolled, shown = page.evaluate(wrap)
    assert scrolled <= shown, "every column in view at 1280 pixels"
    assert tab.unexpected_errors() == []


# At the first frame the chart has drawn step ``n``: its last step, and what the cards and
# the control panel say at that moment.
PAGE_AT_STEP = """n => {
    const x = (document.getElementById('chart').data || [])[6]?.x || [];
    if (!x.length || x[x.length - 1] < n) return null;
    const text = (selector) => document.querySelector(selector).textContent;
    return {
        chart: x[x.length - 1],
        steps: text('[data-fact=steps]'),
        scale: text('[data-fact=scale]'),
        overflows: text('[data-fact=overflows]'),
        skipped: text('[data-fact=skipped_rate]'),
        in_effect: text('#control-state [data-state=scale]'),
    };
}"""


def test_the_cards_show_the_step_the_chart_has_drawn(tab: Tab, served: Served) -> None:
    """Seen live: the "Steps" card said 391 while the chart had drawn ~490 steps, and
    "Current scale" said 2^16 while "Values in effect" said 2^15: the cards waited for the
    next 2 s poll of the run while the chart and the panel took each streamed step."""
    run = runs.create_run(served.store, name="cards", world_size=1, config={}, control={})
    overflows = frozenset({30, 70, 110, 150})

    def power(step: int) -> int:
        return 10 + step // 20 - sum(o < step for o in overflows)

    def write(steps: range) -> None:
        runs.write_steps(served.store, run.id, rising_records(steps, power, overflows))

    write(range(1, 51))
    open_run(tab, run.id)
    tab.page.locator("[data-fact=steps]", has_text="50").wait_for()
    for start, end in ((51, 80), (81, 120), (121, 160)):
        write(range(start, end + 1))
        seen = tab.page.wait_for_function(PAGE_AT_STEP, arg=end).json_value()
        skipped = sum(o <= end for o in overflows)
        assert seen == {
            "chart": end,
            "steps": str(end),
            "scale": seen["in_effect"],
            "overflows": str(skipped),
            "skipped": f"{100 * skipped / end:.2f}%",
            "in_effect": seen["in_effect"],
        }
        assert seen["scale"].endswith(f"(2^{power(end + 1)})"), seen
    assert tab.unexpected_errors() == []


def test_a_step_skipped_for_a_spike_is_its_own_marker_stored_and_live(
    tab: Tab, served: Served
) -> None:
    """A spike skip is marked on the scale panel at the scale it kept, apart from the
    overflows' markers: from the stored steps, and from a live one."""
    import dataclasses

    run = runs.create_run(served.store, name="spiky", world_size=1, config={}, control={})
    spikes = {50, 70}
    records = [
        dataclasses.replace(
            r, skipped=r.step in spikes or r.overflow, spike_skipped=r.step in spikes
        )
        for r in rising_records(range(1, 101), lambda s: 10 + s // 40, frozenset({30}))
    ]
    runs.write_steps(served.store, run.id, records)
    open_run(tab, run.id)
    tab.page.wait_for_function("document.getElementById('chart').data[4].x.length >= 2")
    marked = chart(tab, "[gd.data[4].name, gd.data[4].x, gd.data[4].y, gd.data[3].x]")
    by_step = {r.step: r for r in records}
    assert marked == [
        "skipped for a spike",
        [50, 70],
        [by_step[50].scale_after, by_step[70].scale_after],
        [30],  # the overflow keeps its own marker
    ]
    live = step_record(101, scale=2.0**12, scale_after=2.0**12, skipped=True, spike_skipped=True)
    runs.write_steps(served.store, run.id, [live])
    tab.page.wait_for_function("document.getElementById('chart').data[4].x.length >= 3")
    assert chart(tab, "gd.data[4].x") == [50, 70, 101]
    assert tab.unexpected_errors() == []
