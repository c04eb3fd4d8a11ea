"""The dashboard's overflow diagnosis in headless Chromium: the loss under the scale, a
clicked overflow's parameters, and the parameters that overflow most in the window."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalewatch.store import runs
from scalewatch.store.records import ParamFinding
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.pages import click_overflow, zoom
from tests._helpers.records import step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

FC1 = "encoder.layers.3.fc1.weight"
HEAD = "head.bias"
DASH = "\u2013"  # what the pages show for nothing, and between two steps
FINDINGS = {
    100: (ParamFinding(0, HEAD, "nan", 3), ParamFinding(1, FC1, "inf", 12)),
    200: (ParamFinding(1, FC1, "both", 40),),
}


def _lr(step: int) -> float | None:
    """A warmup over 50 steps, then flat; not recorded on steps 240 to 249."""
    return None if 240 <= step < 250 else 0.001 * min(1.0, step / 50)


def _norm(step: int) -> float | None:
    """Falling from 8 to about 1, not finite (stored as none) at the overflows."""
    return None if step in FINDINGS else 8.0 * 0.993**step


def _diagnosed_run(served: Served) -> int:
    """300 steps with a falling loss; overflows at 100 (backward: two parameters on two
    ranks) and 200 (forward: the loss on rank 1 was inf)."""
    run = runs.create_run(served.store, name="diagnosed", world_size=2, config={}, control={})
    records = [
        step_record(
            step,
            scale=65536.0,
            overflow=step in FINDINGS,
            inf_ranks=tuple(sorted({p.rank for p in FINDINGS.get(step, ())})),
            scale_after=32768.0 if step in FINDINGS else 65536.0,
            loss=float("inf") if step == 200 else 3.0 - step / 200,
            loss_nonfinite_ranks=(1,) if step == 200 else (),
            params=FINDINGS.get(step, ()),
            params_omitted=4 if step == 200 else 0,
            lr=_lr(step),
            grad_norm=_norm(step),
        )
        for step in range(1, 301)
    ]
    runs.write_steps(served.store, run.id, records)
    return run.id


def test_clicking_an_overflow_marker_shows_its_parameters(tab: Tab, served: Served) -> None:
    page = tab.page
    run = _diagnosed_run(served)
    page.goto(f"/run.html?run={run}")
    page.wait_for_function("Number(document.getElementById('chart').dataset.points) > 0")

    detail = click_overflow(tab.page, 100)
    assert detail.locator("h3").inner_text() == "Overflow at step 100"
    assert detail.locator("[data-loss-flag]").get_attribute("data-loss-flag") == "backward"
    headers = detail.locator("table thead th").all_inner_texts()
    assert headers == ["Parameter", "rank 0", "rank 1"]
    cells = {
        row.locator("th").inner_text(): row.locator("td").all_inner_texts()
        for row in detail.locator("table tbody tr").all()
    }
    assert cells == {FC1: [DASH, "inf · 12"], HEAD: ["NaN · 3", DASH]}
    assert "null" not in detail.inner_text()  # no part left out is written as its null
    assert "(2.5)" in detail.locator("[data-loss-flag]").inner_text()

    forward = click_overflow(tab.page, 200)
    flag = forward.locator("[data-loss-flag]")
    assert flag.get_attribute("data-loss-flag") == "forward"
    assert "inf or NaN on rank 1" in flag.inner_text()
    assert "4 more parameters" in forward.inner_text()
    assert tab.unexpected_errors() == []


def test_the_loss_is_drawn_and_the_ranking_follows_the_zoom(tab: Tab, served: Served) -> None:
    page = tab.page
    run = _diagnosed_run(served)
    page.goto(f"/run.html?run={run}")
    page.wait_for_function("Number(document.getElementById('chart').dataset.points) > 0")
    loss = page.evaluate(
        "(gd => gd.data.find((t) => t.name === 'loss'))(document.getElementById('chart'))"
    )
    assert loss["yaxis"] == "y4"
    assert loss["y"][0] == pytest.approx(3.0 - 1 / 200)
    assert loss["y"][199] is None  # the inf loss of step 200: a gap, its overflow says why

    panel = page.locator("#params-panel[data-view=all]")
    panel.wait_for()
    names = panel.locator("tbody tr td.param-name").all_inner_texts()
    assert names == [FC1, HEAD]  # at 2 overflows and at 1
    assert panel.locator("tbody tr").first.locator("td").nth(1).inner_text() == "2 of 2"

    page.evaluate("Plotly.relayout(document.getElementById('chart'), {'xaxis.range': [150, 250]})")
    zoomed = page.locator("#params-panel[data-view='150-250']")
    zoomed.wait_for()
    assert zoomed.locator("tbody tr td.param-name").all_inner_texts() == [FC1]
    assert f"steps 150{DASH}250" in zoomed.inner_text()
    assert tab.unexpected_errors() == []


def test_the_learning_rate_is_a_panel_under_the_loss(tab: Tab, served: Served) -> None:
    page = tab.page
    run = _diagnosed_run(served)
    page.goto(f"/run.html?run={run}")
    page.wait_for_function("Number(document.getElementById('chart').dataset.points) > 0")
    lr, layout = page.evaluate(
        """(gd => [gd.data.find((t) => t.name === 'learning rate' && t.mode === 'lines'
                                && !t.fill?.startsWith('tonext') && t.showlegend !== false),
                   {lr: gd._fullLayout.yaxis5.domain, loss: gd._fullLayout.yaxis4.domain,
                    drawn: gd.querySelectorAll('.y5tick').length}]
        )(document.getElementById('chart'))"""
    )
    assert lr["yaxis"] == "y5"
    assert lr["y"] == pytest.approx([_lr(step) for step in range(1, 301)])
    assert layout["lr"][1] < layout["loss"][0]  # under the loss
    assert layout["drawn"] > 0  # its axis has ticks on the page
    assert tab.unexpected_errors() == []


def test_the_gradient_norm_is_a_log_panel_beside_the_scale(tab: Tab, served: Served) -> None:
    page = tab.page
    run = _diagnosed_run(served)
    page.goto(f"/run.html?run={run}")
    page.wait_for_function("Number(document.getElementById('chart').dataset.points) > 0")
    norm, layout = page.evaluate(
        """(gd => [gd.data.find((t) => t.name === 'gradient norm' && t.mode === 'lines'
                                && !t.fill?.startsWith('tonext') && t.showlegend !== false),
                   {norm: gd._fullLayout.yaxis6.domain, type: gd._fullLayout.yaxis6.type,
                    scale: gd._fullLayout.yaxis.domain, loss: gd._fullLayout.yaxis4.domain,
                    drawn: gd.querySelectorAll('.y6tick').length}]
        )(document.getElementById('chart'))"""
    )
    assert norm["yaxis"] == "y6"
    assert norm["y"] == pytest.approx([_norm(step) for step in range(1, 301)])
    assert layout["type"] == "log"
    assert layout["loss"][1] < layout["norm"][0] and layout["norm"][1] < layout["scale"][0]
    assert layout["drawn"] > 0
    assert tab.unexpected_errors() == []


def test_spikes_are_marked_on_the_loss_and_gradient_norm_panels(tab: Tab, served: Served) -> None:
    page = tab.page
    run = runs.create_run(served.store, name="spiky", world_size=1, config={}, control={})
    records = [
        step_record(
            step,
            loss=9.0 if step == 150 else 2.0 + 0.01 * (step % 5),
            grad_norm=50.0 if step == 250 else 1.0 + 0.02 * (step % 3),
        )
        for step in range(1, 301)
    ]
    runs.write_steps(served.store, run.id, records)
    page.goto(f"/run.html?run={run.id}")
    page.wait_for_function("document.getElementById('chart').dataset.spikes === '2'")
    marks = page.evaluate(
        """(gd => gd.data.filter((t) => ['gradient-norm spike', 'loss spike'].includes(t.name))
                 .map((t) => [t.name, t.yaxis, Array.from(t.x), Array.from(t.y)])
        )(document.getElementById('chart'))"""
    )
    assert marks == [
        ["gradient-norm spike", "y6", [250], [50.0]],
        ["loss spike", "y4", [150], [9.0]],
    ]
    spikes = page.locator('[data-fact="spikes"]')
    spikes.filter(has_text="1 loss · 1 gradient norm").wait_for()  # counted in the run's cards
    norm = page.locator('[data-fact="grad_norm"]').inner_text()
    assert float(norm) == pytest.approx(1.0 + 0.02 * (300 % 3), rel=1e-3)  # the last step's
    assert tab.unexpected_errors() == []


def test_a_panel_with_nothing_recorded_says_so_instead_of_empty_axes(
    tab: Tab, served: Served
) -> None:
    """A run that records no learning rate showed its panel as axes from -1 to 1 over
    nothing; a zoomed view without one says which steps have none."""
    page = tab.page
    run = runs.create_run(served.store, name="no-lr", world_size=1, config={}, control={})
    runs.write_steps(
        served.store,
        run.id,
        [step_record(step, loss=2.0 - step / 100, grad_norm=1.5) for step in range(1, 101)],
    )
    page.goto(f"/run.html?run={run.id}")
    page.wait_for_function("document.getElementById('chart').dataset.unrecorded === 'lr'")
    shown = page.evaluate(
        """(gd => ({loss: gd._fullLayout.yaxis4.visible, lr: gd._fullLayout.yaxis5.visible,
                    lrTicks: gd.querySelectorAll('.y5tick').length,
                    notes: gd.layout.annotations
                        .filter((a) => (a.name || '').startsWith('unrecorded'))
                        .map((a) => a.text)}))(document.getElementById('chart'))"""
    )
    assert shown == {
        "loss": True,
        "lr": False,
        "lrTicks": 0,
        "notes": ["learning rate not recorded by this run"],
    }
    page.get_by_text("learning rate not recorded by this run").wait_for()

    diagnosed = _diagnosed_run(served)  # its learning rate is missing on steps 240 to 249
    page.goto(f"/run.html?run={diagnosed}")
    page.wait_for_function("Number(document.getElementById('chart').dataset.points) > 0")
    assert page.get_attribute("#chart", "data-unrecorded") == ""
    zoom(tab, 241, 248)
    page.get_by_text(f"no learning rate recorded in steps 241{DASH}248").wait_for()
    zoom(tab, 200, 260)
    page.wait_for_function("document.getElementById('chart').dataset.unrecorded === ''")
    assert tab.unexpected_errors() == []
