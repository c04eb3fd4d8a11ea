"""The run page says how far a run's LR schedule is ahead of its weights, or that it holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalewatch.store import runs
from tests._helpers.harness import CHROMIUM, Served, Tab
from tests._helpers.records import step_record

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

SKIPPED = {5, 6, 40}


def _run(served: Served, name: str, schedulers: list[dict[str, object]] | None) -> int:
    """50 steps, skipped at ``SKIPPED``; a scheduler stepped after each, counted as the
    scaler counts it (a held one never drifts; none registered: no drift at all)."""
    config = {} if schedulers is None else {"schedulers": schedulers}
    run = runs.create_run(served.store, name=name, world_size=1, config=config, control={})
    held = schedulers is not None and all(s["held"] for s in schedulers)
    records, drift = [], 0
    for step in range(1, 51):
        records.append(
            step_record(
                step,
                scale=65536.0,
                overflow=step in SKIPPED,
                inf_ranks=(0,) if step in SKIPPED else (),
                scale_after=32768.0 if step in SKIPPED else 65536.0,
                lr=0.001,
                schedule_drift=None if schedulers is None else drift,
            )
        )
        drift += step in SKIPPED and not held
    runs.write_steps(served.store, run.id, records)
    return run.id


@pytest.mark.parametrize(
    ("schedulers", "shown"),
    [
        ([{"name": "LambdaLR", "held": False}], "schedule ahead of the weights by 3 steps"),
        ([{"name": "OneCycleLR", "held": True}], "held: on the weights' steps (drift 0)"),
        (None, None),
    ],
    ids=["drifting", "held", "none"],
)
def test_the_run_page_says_the_schedules_drift(
    tab: Tab, served: Served, schedulers: list[dict[str, object]] | None, shown: str | None
) -> None:
    # Skipped at 5, 6 and 40: step 41's record counts 3, as the last one does.
    page = tab.page
    run = _run(served, "schedule", schedulers)
    page.goto(f"/run.html?run={run}")
    page.locator("[data-fact=steps]", has_text="50").wait_for()
    card = page.locator("#schedule-fact")
    if shown is None:
        assert card.is_hidden()
    else:
        page.locator("[data-fact=schedule]", has_text=shown).wait_for()
        assert card.is_visible()
    assert tab.unexpected_errors() == []
