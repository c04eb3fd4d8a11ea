"""The rules file: what it takes, what it refuses (with the line), and docs/ALERTS.md's account."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scalewatch.app.alerts.config import RulesFileError, default_rules, load_rules, parse_rules
from scalewatch.app.alerts.kinds import KINDS, RunView
from scalewatch.app.alerts.webhooks import payload
from scalewatch.store.alerts import AlertRow
from scalewatch.store.states import AlertState

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "ALERTS.md").read_text(encoding="utf-8")


def _run(name: str, world_size: int = 2) -> RunView:
    return RunView(1, name, world_size, True, 0.0, 0, None)


def test_a_file_of_webhooks_alone_keeps_the_default_rules() -> None:
    config = parse_rules('[[webhook]]\nurl = "http://127.0.0.1:9/hook"\n')
    assert config.rules == default_rules()
    assert [str(hook.url) for hook in config.webhooks] == ["http://127.0.0.1:9/hook"]
    assert config.webhooks[0].timeout_s == 5
    assert {rule.name for rule in default_rules()} == set(KINDS)


def test_rules_replace_the_defaults_and_apply_to_the_runs_their_glob_names() -> None:
    (rule,) = parse_rules('[[rule]]\nname = "hot"\nkind = "rank_hotspot"\nrun = "bert-*"\n').rules
    assert rule.params.model_dump() == {
        "threshold": 0.6,
        "window": 1000,
        "min_overflows": 5,
        "resolve_below": None,
    }
    assert rule.params.resolve_at == pytest.approx(0.55)  # threshold - 0.05
    assert rule.applies_to(_run("bert-large")) and not rule.applies_to(_run("gpt"))
    assert not rule.applies_to(_run("bert-small", world_size=1))  # one rank: no hotspot


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ('[[rule]]\nname = "a"\nkind = "skip_streak"\nthreshold = 0\n', 4,
         "rule 1 ('a'): threshold: Input should be greater than or equal to 1"),
        ('[[rule]]\nname = "a"\nkind = "stalled"\n\n'
         '[[rule]]\nname = "b"\nkind = "stalled"\nsecs = 5\n', 8,
         "rule 2 ('b'): secs: Extra inputs are not permitted"),
        ('[[rule]]\nname = "a"\nkind = "stalled"\n[[rule]]\nname = "a"\nkind = "skip_rate"\n', 5,
         "rule 2 ('a'): name: another rule is called so"),
        ('[[rule]]\nkind = "stalled"\n', 1, "rule 1: name: Field required"),
        ('[[rule]]\nname = "a"\nkind = "stalled"\nrun = ""\n', 4,
         "rule 1 ('a'): run: String should have at least 1 character"),
        ('\n[[alarm]]\nrun = "*"\n', 2, "alarm: Extra inputs are not permitted"),
        ('[[webhook]]\nurl = "http://h/x"\ntimeout_s = 600\n', 3,
         "webhook 1: timeout_s: Input should be less than or equal to 60"),
        ('[[rule]]\nname = "a"\nkind = "stalled"\nthreshold = "soon"\n', 4,
         "rule 1 ('a'): threshold: Input should be a valid number, unable to parse string"),
        ('[[rule]\nname = "a"\n', 1, "not TOML: "),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_with_its_line_and_the_reason(
    text: str, line: int, reason: str
) -> None:
    with pytest.raises(RulesFileError) as refused:
        parse_rules(text, source="rules.toml")
    assert refused.value.line == line
    assert str(refused.value).startswith(f"rules.toml, line {line}: {reason}")


def test_a_missing_file_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(RulesFileError, match=r"nope\.toml: cannot be read"):
        load_rules(tmp_path / "nope.toml")


def test_the_pages_example_file_reads_as_it_says() -> None:
    (example,) = re.findall(r"```toml\n(.*?)```", PAGE, re.S)
    config = parse_rules(example)
    assert [(r.name, r.kind, r.run) for r in config.rules] == [
        ("skips", "skip_rate", "*"), ("bert-floor", "scale_below", "bert-*"),
    ]  # fmt: skip
    refusal = re.search(r"alert rules: (rules\.toml, line .*)", PAGE)
    assert refusal is not None
    with pytest.raises(RulesFileError) as refused:
        parse_rules(example.replace("window = 50", "window = 0"), source="rules.toml")
    assert str(refused.value) == refusal.group(1)


def test_the_pages_table_gives_every_default_rule_and_its_parameters() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (.*) \| (.*) \|$", PAGE, re.M)
    table = {name: defaults for name, _, defaults in rows}
    for rule in default_rules():
        defaults = table.pop(rule.name)
        shown = dict(re.findall(r"`(\w+) = ([\d.]+)`", defaults))
        # A default that follows another parameter (None in the model) is said in words.
        derived = {k for k, v in rule.params.model_dump().items() if v is None}
        assert all(f"`{k} = " in defaults for k in derived), rule.name
        numbers = {k: v for k, v in rule.params.model_dump().items() if k not in derived}
        assert {k: float(v) for k, v in shown.items()} == numbers, rule.name
        assert (
            KINDS[rule.kind].condition.split(" ")[:3]
            == next(cond for name, cond, _ in rows if name == rule.name).split(" ")[:3]
        )
    assert table == {}


def test_the_pages_webhook_body_has_the_fields_sent() -> None:
    (body,) = re.findall(r"```json\n(.*?)```", PAGE, re.S)
    shown = json.loads(body)
    alert = AlertRow(7, 3, "bert-large", "skips", "skip_rate", AlertState.FIRING, 0.2, 0.22,
                     "last 200 steps", 1200, 1764590400.0, None, None, None)  # fmt: skip
    assert shown == payload(alert)
