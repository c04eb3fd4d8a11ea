"""Alerts as the service delivers them: the API, /metrics, the CLI, ``serve --alerts``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from scalewatch.app.cli import main
from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store
from scalewatch.store.runs import write_steps
from tests._helpers.service import LOCAL, add_run, simulate

RULES = """
[[rule]]
name = "streak"
kind = "skip_streak"
threshold = 3
run = "bert*"
"""


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(RULES, encoding="utf-8")
    return path


@pytest.fixture
def alerting(settings: Settings, store: Store, rules_file: Path) -> Iterator[TestClient]:
    """The service with ``RULES``, its evaluator ticking every 20 ms."""
    settings = settings.model_copy(update={"alerts": rules_file, "alerts_interval_s": 0.02})
    with TestClient(create_app(settings), base_url=LOCAL) as test_client:
        yield test_client


def _tick(client: TestClient) -> None:
    client.app.state.services.alerts.tick()  # type: ignore[attr-defined]


def _firing_run(client: TestClient, store: Store, name: str = "bert") -> int:
    """A run the service has seen, then overflowing at steps 11-14: the streak fires at 13."""
    run = add_run(store, simulate(10, set()), name=name)
    _tick(client)
    write_steps(store, run, simulate(10, {11, 12, 13, 14}, first=11))
    _tick(client)
    return run


def test_the_api_lists_alerts_of_every_run_and_of_one(alerting: TestClient, store: Store) -> None:
    run = _firing_run(alerting, store)
    other = _firing_run(alerting, store, name="gpt")  # the rule is for bert* alone
    body = alerting.get(f"/api/runs/{run}/alerts").json()
    (alert,) = body["alerts"]
    assert body["next"] is None
    assert alert["rule"] == "streak" and alert["kind"] == "skip_streak"
    assert alert["run"] == {"id": run, "name": "bert"}
    assert (alert["state"], alert["fired_step"], alert["resolved_step"]) == ("resolved", 13, 15)
    assert (alert["value"], alert["resolved_value"], alert["threshold"]) == (3, 0, 3)
    assert alert["text"].startswith("scalewatch: streak (skip_streak) resolved on run 'bert'")
    assert alerting.get(f"/api/runs/{other}/alerts").json()["alerts"] == []
    assert [a["id"] for a in alerting.get("/api/alerts").json()["alerts"]] == [alert["id"]]
    assert alerting.get("/api/alerts?state=firing").json()["alerts"] == []
    assert alerting.get("/api/runs/999/alerts").status_code == 404
    assert alerting.get("/api/alerts?state=asleep").status_code == 422


def test_alerts_page_newest_first(alerting: TestClient, store: Store) -> None:
    runs = [_firing_run(alerting, store, name=f"bert-{i}") for i in range(3)]
    first = alerting.get("/api/alerts?limit=2").json()
    assert [a["run"]["id"] for a in first["alerts"]] == runs[:0:-1]
    rest = alerting.get(f"/api/alerts?limit=2&before={first['next']}").json()
    assert [a["run"]["id"] for a in rest["alerts"]] == runs[:1] and rest["next"] is None


def test_the_background_evaluator_fires_without_being_asked(
    alerting: TestClient, store: Store
) -> None:
    run = add_run(store, simulate(10, set()), name="bert")
    deadline = time.monotonic() + 10
    while alerting.app.state.services.alerts.ticks < 2:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the evaluator did not tick"
        time.sleep(0.01)
    write_steps(store, run, simulate(5, {11, 12, 13, 14, 15}, first=11))
    while not alerting.get("/api/alerts?state=firing").json()["alerts"]:
        assert time.monotonic() < deadline, "no alert fired"
        time.sleep(0.01)


def _alert_samples(client: TestClient) -> list[dict[str, str]]:
    families = text_string_to_metric_families(client.get("/metrics").text)
    return [
        sample.labels
        for family in families
        for sample in family.samples
        if sample.name == "scalewatch_alert_firing" and sample.value == 1
    ]


def test_metrics_show_each_firing_alert(alerting: TestClient, store: Store) -> None:
    run = add_run(store, simulate(10, set()), name="bert")
    _tick(alerting)
    assert _alert_samples(alerting) == []
    write_steps(store, run, simulate(4, {11, 12, 13, 14}, first=11))
    _tick(alerting)
    assert _alert_samples(alerting) == [{"run_id": str(run), "run_name": "bert", "rule": "streak"}]
    write_steps(store, run, simulate(1, set(), first=15))
    _tick(alerting)
    assert _alert_samples(alerting) == []


def test_the_cli_lists_alerts(
    alerting: TestClient, store: Store, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _firing_run(alerting, store)
    capsys.readouterr()
    assert main(["alerts", "--db", db_url]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "RUN", "RULE", "STATE", "STEP", "FIRED", "RESOLVED", "VALUE",
                              "THRESHOLD"]  # fmt: skip
    assert row.split()[:6] == ["1", f"#{run}", "bert", "streak", "resolved", "13-15"]
    assert main(["alerts", "--db", db_url, "--firing"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == []
    assert main(["alerts", "--db", db_url, "--jsonl", "--run", str(run)]) == 0
    assert '"fired_step": 13' in capsys.readouterr().out
    assert main(["alerts", "--db", db_url, "--run", "99"]) == 1
    assert "no run 99" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[[rule]]\nname = 'a'\nkind = 'skip_rate'\nwindow = -1\n",
         "line 4: rule 1 ('a'): window: Input should be greater than 0"),
        ("[[rule]]\nname = 'a'\nkind = 'skip_rat'\n",
         "line 3: rule 1 ('a'): kind: 'skip_rat' is no rule kind"),
        ("[[webhook]]\nurl = 'hooks.example'\n", "line 2: webhook 1: url: "),
        ("[[rule]]\nname = 'a'\nkind = \n", "line 3: not TOML: "),
    ],
)  # fmt: skip
def test_serve_refuses_a_bad_rules_file_with_its_line_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(text, encoding="utf-8")
    token = tmp_path / "token"
    argv = ["serve", "--db", str(tmp_path / "sw.db"), "--port", "0", "--alerts", str(rules)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCALEWATCH_TOKEN_FILE", str(token))
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"scalewatch serve: alert rules: {rules}, ") and said in err, err
    assert not token.exists() and not (tmp_path / "sw.db").exists()


def test_a_bad_rules_file_in_the_environment_is_one_line_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("[[rule]]\nname = 'a'\nkind = 'stalled'\nthreshold = 0\n", encoding="utf-8")
    monkeypatch.setenv("SCALEWATCH_ALERTS", str(rules))
    monkeypatch.setenv("SCALEWATCH_TOKEN_FILE", str(tmp_path / "token"))
    assert main(["serve", "--db", str(tmp_path / "sw.db"), "--port", "0"]) == 2
    assert capsys.readouterr().err == (
        f"scalewatch serve: alert rules: {rules}, line 4: rule 1 ('a'): threshold:"
        " Input should be greater than 0\n"
    )
