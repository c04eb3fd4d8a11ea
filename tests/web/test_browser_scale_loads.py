"""The run page marks each load of the scaler's state on the scale panel, in headless
Chromium: a jump strongly, with its hover text, a load of the same scale lightly; a load
recorded while the page is open is marked at the next poll of the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalewatch.store import runs
from scalewatch.store.scale_loads import ScaleLoad, record_scale_load
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.records import step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

MARKS = """(gd => ({
    loads: gd.dataset.scaleLoads, jumps: gd.dataset.scaleJumps,
    lines: gd.layout.shapes.filter((s) => (s.name || '').startsWith('scale-load-'))
        .map((s) => [s.x0, s.yref, s.line.dash || 'solid']),
    labels: gd.layout.annotations.filter((a) => (a.hovertext || '').startsWith('scale loaded'))
        .map((a) => [a.x, a.text, a.hovertext]),
}))(document.getElementById('chart'))"""


def _resumed_run(served: Served) -> int:
    """100 steps at 1024, then (a resumed job that restored another scale) 100 at 65536, and
    a load of the same scale at the end."""
    run = runs.create_run(served.store, name="resumed", world_size=1, config={}, control={})
    records = [
        step_record(step, scale=1024.0 if step <= 100 else 65536.0) for step in range(1, 201)
    ]
    runs.write_steps(served.store, run.id, records[:100])
    record_scale_load(served.store, run.id, ScaleLoad(step=100, at=1.0, scale_after=65536.0))
    runs.write_steps(served.store, run.id, records[100:])
    record_scale_load(served.store, run.id, ScaleLoad(step=200, at=2.0, scale_after=65536.0))
    return run.id


def test_a_jump_is_marked_on_the_scale_panel_and_a_new_load_at_the_next_poll(
    tab: Tab, served: Served
) -> None:
    page = tab.page
    run = _resumed_run(served)
    page.goto(f"/run.html?run={run}")
    page.wait_for_function("document.getElementById('chart').dataset.scaleLoads === '2'")
    marks = page.evaluate(MARKS)
    assert (marks["loads"], marks["jumps"]) == ("2", "1")
    assert marks["lines"] == [[100, "y domain", "solid"], [200, "y domain", "dot"]]
    assert marks["labels"] == [
        [100, "⇅ scale loaded", "scale loaded: 1,024 (2^10) → 65,536 (2^16) at step 100"],
        [200, "loaded", "scale loaded: 65,536 (2^16), unchanged at step 200"],
    ]

    record_scale_load(
        served.store, run, ScaleLoad(step=120, at=3.0, scale_after=8.0, scale_before=65536.0,
                                     from_step=200)
    )  # fmt: skip
    page.wait_for_function("document.getElementById('chart').dataset.scaleLoads === '3'")
    marks = page.evaluate(MARKS)
    assert marks["jumps"] == "2"
    assert [120, "⇅ scale loaded",
            "scale loaded: 65,536 (2^16) → 8 (2^3) at step 120 (the run was at step 200)"
            ] in marks["labels"]  # fmt: skip
    assert tab.unexpected_errors() == []
