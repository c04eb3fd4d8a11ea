"""Webhooks against a real HTTP receiver on 127.0.0.1: delivered, retried, timed out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from scalewatch.app.alerts.config import Webhook
from scalewatch.app.alerts.webhooks import WebhookSender, payload
from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store.alerts import AlertRow
from scalewatch.store.engine import Store
from scalewatch.store.runs import write_steps
from scalewatch.store.states import AlertState
from tests._helpers.receiver import receiver
from tests._helpers.service import LOCAL, add_run, simulate
from tests._helpers.waiting import wait_for

ALERT = AlertRow(
    7, 3, "bert", "skips", "skip_rate", AlertState.FIRING, 0.05, 0.08, "last 200 steps",
    1200, 1.7e9, None, None, None,
)  # fmt: skip


@pytest.fixture
def sender() -> Iterator[list[WebhookSender]]:
    made: list[WebhookSender] = []
    yield made
    for one in made:
        one.close()


def _sender(made: list[WebhookSender], *urls: str, timeout_s: float = 5.0) -> WebhookSender:
    hooks = [Webhook.model_validate({"url": url, "timeout_s": timeout_s}) for url in urls]
    one = WebhookSender(hooks, attempts=3, backoff_s=0.01).start()
    made.append(one)
    return one


def test_the_payload_names_rule_state_run_step_value_threshold_and_a_line() -> None:
    body = payload(ALERT)
    assert {key: body[key] for key in ("rule", "state", "run", "step", "value", "threshold")} == {
        "rule": "skips", "state": "firing", "run": {"id": 3, "name": "bert"}, "step": 1200,
        "value": 0.08, "threshold": 0.05,
    }  # fmt: skip
    assert body["text"] == (
        "scalewatch: skips (skip_rate) firing on run 'bert' (#3) at step 1200:"
        " 8% of the last 200 steps skipped (threshold 5%)"
    )
    assert body["says"] == "8% of the last 200 steps skipped (threshold 5%)"


def test_a_webhook_is_posted_as_json(sender: list[WebhookSender]) -> None:
    with receiver() as hook:
        one = _sender(sender, hook.url)
        one.send(ALERT)
        wait_for(lambda: one.counts["delivered"] == 1, what="the delivery")
    assert hook.bodies == [payload(ALERT)]


def test_a_receiver_that_fails_first_gets_it_on_a_retry(sender: list[WebhookSender]) -> None:
    with receiver([503, 502]) as hook:
        one = _sender(sender, hook.url)
        one.send(ALERT)
        wait_for(lambda: one.counts["delivered"] == 1, what="the delivery")
    assert hook.attempts == 3 and hook.bodies == [payload(ALERT)]
    assert one.deliveries[-1].attempts == 3


def test_a_refusal_is_not_retried_and_spent_retries_give_up(sender: list[WebhookSender]) -> None:
    with receiver([400]) as refusing, receiver([500, 500, 500, 500]) as failing:
        one = _sender(sender, refusing.url, failing.url)
        one.send(ALERT)
        wait_for(lambda: one.counts["failed"] == 2, what="both to give up")
    assert refusing.attempts == 1 and failing.attempts == 3
    assert refusing.bodies == failing.bodies == []


def test_a_hanging_receiver_times_out_and_holds_up_no_other(sender: list[WebhookSender]) -> None:
    with receiver(hang=True) as hanging, receiver() as fine:
        # 3 attempts of 0.5 s: the hanging one is still being tried while the other is sent
        one = _sender(sender, hanging.url, fine.url, timeout_s=0.5)
        started = time.monotonic()
        one.send(ALERT)
        assert time.monotonic() - started < 0.1  # send never waits for a receiver
        wait_for(lambda: one.counts["delivered"] == 1, what="the other receiver's delivery")
        assert one.counts["failed"] == 0  # the hanging one is still being tried
        wait_for(lambda: one.counts["failed"] == 1, what="the hanging one to time out")
        # A timed-out POST may reach the receiver's handler only after the sender gave up.
        wait_for(lambda: hanging.attempts == 3, what="the hanging one's three POSTs")
    assert fine.bodies == [payload(ALERT)]
    assert "ReadTimeout" not in str(one.deliveries)  # outcomes, not exceptions


def test_a_full_queue_drops_new_deliveries(sender: list[WebhookSender]) -> None:
    with receiver(hang=True) as hanging:
        hooks = [Webhook.model_validate({"url": hanging.url, "timeout_s": 5})]
        one = WebhookSender(hooks, queue_size=1).start()
        sender.append(one)
        one.send(ALERT)
        wait_for(lambda: hanging.attempts == 1, what="the first POST")
        one.send(ALERT)  # queued
        one.send(ALERT)  # dropped
        assert one.counts["dropped"] == 1


def test_the_service_posts_firing_and_resolved_while_a_hanging_hook_times_out(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    with receiver(hang=True) as hanging, receiver() as hook:
        rules = tmp_path / "rules.toml"
        rules.write_text(
            f'[[webhook]]\nurl = "{hanging.url}"\ntimeout_s = 0.5\n\n'
            f'[[webhook]]\nurl = "{hook.url}"\n\n'
            '[[rule]]\nname = "streak"\nkind = "skip_streak"\nthreshold = 3\n',
            encoding="utf-8",
        )
        settings = settings.model_copy(update={"alerts": rules, "alerts_interval_s": 0.02})
        with TestClient(create_app(settings), base_url=LOCAL) as client:
            alerts = client.app.state.services.alerts  # type: ignore[attr-defined]
            run = add_run(store, simulate(10, set()), name="bert")
            alerts.tick()
            write_steps(store, run, simulate(3, {11, 12, 13}, first=11))
            alerts.tick()
            write_steps(store, run, simulate(1, set(), first=14))
            alerts.tick()
            wait_for(lambda: len(hook.bodies) == 2, what="firing and resolved")
            # Held; on a loaded machine its handler may see the POST only after the timeout.
            wait_for(lambda: hanging.attempts >= 1, what="the hanging hook's POST")
            assert client.get("/api/alerts").status_code == 200
            metrics = client.get("/metrics").text
    assert 'scalewatch_webhook_deliveries_total{outcome="delivered"} 2.0' in metrics
    firing, resolved = hook.bodies
    assert (firing["state"], firing["step"], firing["value"]) == ("firing", 13, 3)
    assert (resolved["state"], resolved["step"], resolved["value"]) == ("resolved", 14, 0)
    assert firing["run"] == resolved["run"] == {"id": run, "name": "bert"}
    assert resolved["text"].startswith("scalewatch: streak (skip_streak) resolved on run 'bert'")
