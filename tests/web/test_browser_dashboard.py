"""The dashboard in headless Chromium, against a real service and a run being trained."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from sqlalchemy import select

from scalewatch.store import control, control_rules, queries, runs
from scalewatch.store.schema import steps
from tests._helpers.harness import CHROMIUM, HOSTILE_NAME, Served, Tab
from tests._helpers.pages import POINTS, chart, open_run, zoom
from tests._helpers.records import rising_records

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")


def submit(tab: Tab, token: str | None = None, **values: object) -> None:
    page = tab.page
    if token is not None:
        page.fill("#token", token)
    for name, value in values.items():
        page.fill(f"#f-{name}", str(value))
    page.click("#control-submit")


def test_runs_page_lists_runs_live_and_links_to_them(tab: Tab, served: Served) -> None:
    page = tab.page
    page.goto("/")
    row = page.locator(f'#runs tbody tr[data-run-id="{served.run_id}"]')
    row.wait_for()
    assert row.locator(".badge").inner_text() == "● running"
    finished = page.locator(f'#runs tbody tr[data-run-id="{served.other_runs[HOSTILE_NAME]}"]')
    assert finished.locator(".badge").inner_text() == "✓ finished"

    steps_cell = row.locator("td").nth(3)
    before = int(steps_cell.inner_text().replace(",", ""))
    page.wait_for_function(
        """([id, before]) => {
            const cell = document.querySelector(`#runs tr[data-run-id='${id}'] td:nth-child(4)`);
            return Number(cell.textContent.replace(/,/g, "")) > before;
        }""",
        arg=[served.run_id, before],
        timeout=30_000,
    )

    row.locator("a").click()
    page.wait_for_url(f"**/run.html?run={served.run_id}")
    assert tab.unexpected_errors() == []


def test_hostile_run_name_renders_as_text(tab: Tab, served: Served) -> None:
    page = tab.page
    run_id = served.other_runs[HOSTILE_NAME]
    page.goto("/")
    link = page.locator(f'#runs tbody tr[data-run-id="{run_id}"] a')
    assert link.inner_text() == HOSTILE_NAME
    assert page.locator("#runs img").count() == 0

    open_run(tab, run_id)
    # The name comes with the run's detail, a request of its own beside the chart's.
    page.locator("#run-name", has_text=HOSTILE_NAME).wait_for()
    assert page.inner_text("#run-name") == HOSTILE_NAME
    assert page.title() == f"{HOSTILE_NAME} · scalewatch"
    assert page.locator("main img").count() == 0
    assert tab.dialogs == []
    assert tab.unexpected_errors() == []


def test_run_chart_grows_live_with_overflows_marked(tab: Tab, served: Served) -> None:
    open_run(tab, served.run_id)
    # Read together: live steps may land between two separate reads.
    before, shown = chart(tab, "[gd.data[2].x.length, Number(gd.dataset.points)]")
    assert shown == before
    tab.page.wait_for_function(f"{POINTS} > {before}", timeout=30_000)

    tab.page.wait_for_function("document.getElementById('chart').data[3].x.length > 0")
    marked = chart(tab, "gd.data[3].x.map((step, i) => [step, gd.data[3].customdata[i][1]])")
    assert isinstance(marked, list)
    marked.sort()
    with served.store.engine.connect() as conn:
        stored = conn.execute(
            select(steps.c.step, steps.c.inf_ranks)
            .where(steps.c.run_id == served.run_id, steps.c.overflow, steps.c.step <= marked[-1][0])
            .order_by(steps.c.step)
        ).all()
    assert [[step, ranks.replace(",", ", ")] for step, ranks in stored] == marked
    # The trainer poisons a gradient on rank 1 at step 25 and on both ranks at step 100.
    assert [25, "1"] in marked
    assert [100, "0, 1"] in marked


def test_zoom_requeries_finer_buckets_and_autoscale_returns(tab: Tab, served: Served) -> None:
    page = tab.page
    open_run(tab, served.run_id)
    zoom(tab, 50, 150)
    assert page.get_attribute("#chart", "data-bucket-width") == "1"
    first = chart(tab, "gd.data[2].x.slice(0, 101)")
    assert first == list(range(50, 151))

    page.evaluate("Plotly.relayout(document.getElementById('chart'), {'xaxis.autorange': true})")
    page.locator("#chart[data-view='all']").wait_for(state="attached")
    assert chart(tab, "gd.data[2].x[0]") < 50
    assert tab.unexpected_errors() == []


def test_a_zoomed_view_ticks_its_own_scales_and_widens_for_live_steps(
    tab: Tab, served: Served
) -> None:
    """Its ticks came from the whole run's scales (every third power of two here), and its
    y range stayed put when live steps inside it went beyond."""
    page = tab.page
    run = runs.create_run(served.store, name="rising", world_size=1, config={}, control={})
    # Overflows far outside the view, at the run's lowest and highest scales.
    rising = rising_records(range(1, 1001), lambda s: 2 + s // 46, frozenset({5, 995}))
    runs.write_steps(served.store, run.id, rising)
    open_run(tab, run.id)
    zoom(tab, 600, 740)
    ticks = chart(tab, "gd.layout.yaxis.tickvals")
    assert {2.0**k for k in range(15, 19)} <= set(ticks)  # type: ignore[arg-type]

    zoom(tab, 950, 1100)
    page.locator("#live[data-state=live]").wait_for()
    runs.write_steps(served.store, run.id, rising_records(range(1001, 1006), lambda s: 30))
    page.wait_for_function(
        "(gd => 10 ** gd.layout.yaxis.range[1] >= 2 ** 30)(document.getElementById('chart'))"
    )
    assert 2.0**30 in chart(tab, "gd.layout.yaxis.tickvals")  # type: ignore[operator]
    assert tab.unexpected_errors() == []


def test_a_zoomed_views_skipped_rate_counts_the_steps_before_it(tab: Tab, served: Served) -> None:
    """It started from nothing at the view's left edge: 0 right after 200 skipped steps."""
    run = runs.create_run(served.store, name="skipping", world_size=1, config={}, control={})
    records = rising_records(range(1, 801), lambda s: 16, frozenset(range(400, 600)))
    runs.write_steps(served.store, run.id, records)
    open_run(tab, run.id)
    zoom(tab, 600, 700)
    trace = "gd.data.find((t) => t.name.startsWith('skipped-step rate'))"
    first_step, first_rate = chart(tab, f"[{trace}.x[0], {trace}.y[0]]")  # type: ignore[misc]
    assert first_step == 600
    assert first_rate == pytest.approx(199 / 200)  # steps 401-600: all but step 600 skipped
    assert tab.unexpected_errors() == []


def test_control_change_asks_token_again_then_applies_and_marks_chart(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    open_run(tab, served.run_id)
    assert page.is_visible("#token")
    assert page.inner_text("#whoami") == "anonymous · read-only"

    submit(tab, token="not-the-token", growth_interval=37)
    page.locator("#token-error").wait_for()
    assert "refused" in page.inner_text("#token-error")
    assert page.evaluate("document.activeElement.id") == "token"

    submit(tab, token=served.token)
    row = page.locator("#history tbody tr[data-status=applied]", has_text="growth_interval = 37")
    row.wait_for(timeout=30_000)
    applied_step = int(row.locator("[data-cell=applied-step]").inner_text())
    stored = [
        r
        for r in control.control_history(served.store, served.run_id)
        if r.values == {"growth_interval": 37}
    ]
    assert [(r.status, r.applied_step) for r in stored] == [("applied", applied_step)]
    with served.store.engine.connect() as conn:
        intervals = dict(
            conn.execute(
                select(steps.c.step, steps.c.growth_interval).where(
                    steps.c.run_id == served.run_id,
                    steps.c.step.between(applied_step - 1, applied_step),
                )
            ).all()
        )
    assert intervals[applied_step] == 37  # the training ranks use it from that step
    assert intervals[applied_step - 1] != 37

    page.wait_for_function(
        "step => document.getElementById('chart').layout.shapes.some(s => s.x0 === step)",
        arg=applied_step,
    )
    page.locator("[data-state=growth_interval]", has_text="37").wait_for()
    assert not page.is_visible("#token")  # kept for the browser session
    assert page.evaluate("sessionStorage.getItem('scalewatch.token')") == served.token
    # The header names who the accepted token is, no longer "anonymous · read-only".
    page.wait_for_function(
        "document.getElementById('whoami').textContent !== 'anonymous · read-only'"
    )
    assert page.inner_text("#whoami") == "admin · admin"
    assert tab.unexpected_errors(401) == []


def test_refused_value_shows_the_field_message(tab: Tab, served: Served) -> None:
    page = tab.page
    open_run(tab, served.run_id)
    submit(tab, token=served.token, growth_interval=0)
    error = page.locator("#f-growth_interval-error")
    error.wait_for()
    run = queries.get_run(served.store, served.run_id)
    assert run is not None
    with pytest.raises(control.ControlValidationError) as refused:
        control.validate_control({"growth_interval": 0}, run.control)
    assert error.inner_text() == refused.value.errors["growth_interval"]
    assert page.get_attribute("#f-growth_interval", "aria-invalid") == "true"
    assert page.evaluate("document.activeElement.id") == "f-growth_interval"
    assert tab.unexpected_errors(422) == []


def test_an_accepted_token_clears_the_refusal_and_odd_numbers_stay_home(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if r.method == "POST" else None)
    open_run(tab, served.run_id)
    assert not page.is_visible("#forget-token")  # no token stored: nothing to forget
    for value, message in (
        ("0x10", "finite number"),
        ("5.5", "whole number"),
        ("0", control_rules.RULES["growth_interval"]),  # the served rule, checked in the page
    ):
        submit(tab, token=served.token, growth_interval=value)
        page.locator("#f-growth_interval-error", has_text=message).wait_for()
        page.fill("#f-growth_interval", "")
    assert requests == []  # refused in the page, never sent
    submit(tab, token="not-the-token", growth_interval=40)
    page.locator("#token-error").wait_for()
    page.fill("#f-growth_interval", "")
    # 422 (min_scale > max_scale, which the page does not check): the token was accepted.
    submit(tab, token=served.token, min_scale=8, max_scale=4)
    page.locator("#f-min_scale-error", has_text="max_scale").wait_for()
    assert not page.is_visible("#token-error")
    assert page.get_attribute("#token", "aria-invalid") == "false"
    assert page.is_visible("#forget-token")
    assert tab.unexpected_errors(401, 422) == []


def test_the_live_stream_starts_where_the_chart_ends(tab: Tab, served: Served) -> None:
    """Opened before the chart's data, it started after whatever step the server had then,
    and the steps in between were never drawn."""
    page = tab.page
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if "/stream" in r.url else None)
    open_run(tab, served.run_id)
    page.locator("#live[data-state=live]").wait_for()
    first = streams[0]
    match = re.search(r"[?&]after=(-?[0-9]+)", first)
    assert match is not None, first
    # The scale line steps at each bucket's last step + 1 (the scale after it applies from
    # there): the bucket the stream continues from was drawn, whatever the buckets' width.
    drawn = set(chart(tab, "gd.data.find((t) => t.name === 'scale used').x"))  # type: ignore[arg-type]
    assert int(match.group(1)) + 1 in drawn


def test_a_run_id_that_is_no_number_is_said_so_once(tab: Tab, served: Served) -> None:
    page = tab.page
    api: list[str] = []
    page.on("request", lambda r: api.append(r.url) if "/api/" in r.url else None)
    page.goto("/run.html?run=abc")
    page.locator("#error", has_text='"abc" is not a run id').wait_for()
    assert api == []


def test_finished_run_says_it_is_not_running_and_takes_no_changes(tab: Tab, served: Served) -> None:
    page = tab.page
    open_run(tab, served.other_runs[HOSTILE_NAME])
    page.locator("#live[data-state=ended]").wait_for()
    page.locator("#control-closed", has_text="This run is finished").wait_for()
    assert page.is_disabled("#f-growth_factor") and page.is_disabled("#control-submit")
    assert page.is_disabled("#token")
    # Neither a token box nor greyed fields: the note says why there is no form.
    for part in ("#token-box", "#control-fields", "#control-submit", "#control-form-help"):
        assert not page.is_visible(part), part
    # A submission by script, token and value given, sends nothing: fetch is called (or not)
    # before submit() first awaits, so the count is final when the event has been handled.
    posts = page.evaluate(
        """() => {
          let posts = 0;
          const fetch = window.fetch;
          window.fetch = (url, init) => {
            if (init && init.method === "POST") posts += 1;
            return fetch(url, init);
          };
          document.getElementById("token").value = "some-token";
          document.getElementById("f-growth_factor").value = "3";
          document.getElementById("control-form").requestSubmit();
          return posts;
        }"""
    )
    assert posts == 0
    # A running run's form is open.
    open_run(tab, served.run_id)
    page.locator("[data-fact=steps]", has_text=re.compile("[0-9]")).wait_for()
    assert not page.is_visible("#control-closed")
    assert page.is_enabled("#f-growth_factor") and page.is_enabled("#control-submit")
    assert page.is_visible("#token-box") and page.is_visible("#control-fields")


def test_overflow_csv_download_matches_store(tab: Tab, served: Served) -> None:
    page = tab.page
    open_run(tab, served.run_id)
    with page.expect_download() as download:
        page.click("[data-export=overflows-csv]")
    path = download.value.path()
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    assert rows, "the export has no overflow rows"
    last = int(rows[-1]["step"])
    with served.store.engine.connect() as conn:
        stored = (
            conn.execute(
                select(steps)
                .where(steps.c.run_id == served.run_id, steps.c.overflow, steps.c.step <= last)
                .order_by(steps.c.step)
            )
            .mappings()
            .all()
        )
    assert [int(row["step"]) for row in rows] == [row["step"] for row in stored]
    for got, want in zip(rows, stored, strict=True):
        assert float(got["scale"]) == want["scale"]
        assert float(got["scale_after"]) == want["scale_after"]
        assert re.findall(r"\d+", got["inf_ranks"]) == want["inf_ranks"].split(",")
    for what in ("overflows", "steps"):
        for fmt in ("csv", "jsonl"):
            href = page.get_attribute(f"[data-export={what}-{fmt}]", "href")
            assert href == f"api/runs/{served.run_id}/export?what={what}&format={fmt}"


def test_no_console_errors_on_either_page(tab: Tab, served: Served) -> None:
    page = tab.page
    page.goto("/")
    page.locator("#runs tbody tr").first.wait_for()
    page.wait_for_function("document.getElementById('updated').textContent.startsWith('Updated')")
    open_run(tab, served.run_id)
    before = chart(tab, "gd.data[2].x.length")
    page.wait_for_function(f"{POINTS} > {before}")
    page.hover("#chart .nsewdrag")
    assert tab.errors == []
    assert tab.dialogs == []
