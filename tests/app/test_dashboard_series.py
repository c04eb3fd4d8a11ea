"""The dashboard's one chart table (web/chart_figure.js) against the step schema: every band
it draws is a series the service sends, rolled up from the step fields it names."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from scalewatch.store.step_schema import SERIES, SERIES_KEYS, Fold

ROOT = Path(__file__).resolve().parents[2]

BANDS = """
import { CHARTS, stepAsBucket } from "./web/chart_figure.js";
const bands = CHARTS.filter((row) => row.band);
const row = JSON.parse(process.argv[1]);
console.log(JSON.stringify({
  bands: bands.map(({ band, fields, nullable }) => ({ band, fields, nullable: !!nullable })),
  live: stepAsBucket(row),
}));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_each_band_the_dashboard_draws_is_a_declared_series() -> None:
    row = {"step": 5, "scale": 8.0, "scale_after": 4.0, "growth_tracker": 0, "skipped": True}
    done = subprocess.run(
        ["node", "--input-type=module", "-e", BANDS, json.dumps({**row, "loss": 2.0})],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    shown = json.loads(done.stdout)
    declared = {spec.name: spec for spec in SERIES}
    assert shown["bands"], "the dashboard draws bands"
    for band in shown["bands"]:
        spec = declared[band["band"]]
        assert spec.fold is Fold.RANGE
        assert band["fields"] == [f.name for f in spec.fields]
        assert band["nullable"] == spec.nullable
        assert {f"{spec.name}_{end}" for end in ("min", "max", "last")} <= set(SERIES_KEYS)
    # A live row is the bucket the service would send for that step alone.
    live = shown["live"]
    assert (live["scale_min"], live["scale_max"], live["scale_last"]) == (4.0, 8.0, 4.0)
    assert (live["loss_min"], live["loss_last"], live["lr_min"]) == (2.0, 2.0, None)
    assert (live["n"], live["skipped"]) == (1, 1)
