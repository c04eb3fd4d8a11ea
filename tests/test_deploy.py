"""deploy/: the Prometheus rules and the Grafana dashboard name what the service exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.runs import create_run, write_steps
from tests._helpers.records import step_record

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "scalewatch-rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "scalewatch-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "scalewatch-dashboard.json"
METRIC = re.compile(r"\bscalewatch_[a-z_]+\b")
# Labels Prometheus itself adds to every scraped series.
SCRAPE_LABELS = {"instance", "job"}


def _exported(tmp_path: Path) -> dict[str, set[str]]:
    """Sample name -> label names, from the /metrics of a real service with a run whose
    scale is under the default floor: its scale_below alert firing."""
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    app = create_app(Settings(db=url, token_file=tmp_path / "token"))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        store = client.app.state.services.store  # type: ignore[attr-defined]
        run = create_run(store, name="bert", world_size=1, config={}, control={})
        low = step_record(1, wall_time=time.time(), scale=0.5)
        write_steps(store, run.id, [low])
        client.app.state.services.alerts.tick()  # type: ignore[attr-defined]
        text = client.get("/metrics").text
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        if not family.samples:
            exported[family.name] = set()
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [
        (target["expr"], target.get("legendFormat", ""))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_every_metric_named_is_exported_with_the_labels_named(tmp_path: Path) -> None:
    exported = _exported(tmp_path)
    assert "scalewatch_alert_firing" in exported and "scalewatch_steps_total" in exported
    labels = set().union(*exported.values()) | SCRAPE_LABELS
    rules = _rules()
    assert {rule["alert"] for rule in rules} >= {"ScalewatchAlertFiring", "ScalewatchRunStalled"}
    for rule in rules:
        assert set(METRIC.findall(rule["expr"])) <= set(exported), rule["alert"]
        assert rule["annotations"]["summary"] and rule["labels"]["severity"]
        named = re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"]))
        assert set(named) <= labels, rule["alert"]
    exprs = _dashboard_exprs()
    for expr, legend in exprs:
        assert set(METRIC.findall(expr)) <= set(exported), expr
        assert set(re.findall(r"\{\{(\w+)\}\}", legend)) <= labels, legend
    # The dashboard shows every metric the service exports.
    shown = {name for expr, _ in exprs for name in METRIC.findall(expr)}
    assert shown == set(exported)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="apt-get install prometheus")
def test_promtool_checks_the_rules_and_runs_their_unit_test() -> None:
    for args in (["check", "rules", RULES.name], ["test", "rules", RULES_TEST.name]):
        done = subprocess.run(
            ["promtool", *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
