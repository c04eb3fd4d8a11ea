"""The autopilot's loop over a store: what it files, records and leaves alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from scalewatch.app.alerts.config import RulesFileError, parse_rules
from scalewatch.app.autopilot import AutopilotLoop, run_loop
from scalewatch.app.settings import Settings
from scalewatch.store.autopilot import (
    disable_autopilot,
    enabled_autopilots,
    get_autopilot,
    set_autopilot,
)
from scalewatch.store.control import control_history, mark_rejected
from scalewatch.store.engine import Store
from scalewatch.store.errors import ControlValidationError, RunNotRunning
from scalewatch.store.runs import create_run, end_run, write_steps
from scalewatch.store.states import AutopilotState, RequestSource, RequestStatus, RunStatus
from tests._helpers.service import (
    CONTROL,
    IDLE_AUTOPILOT_S,
    add_run,
    after_first_autopilot_tick,
    simulate,
)

EVERY_TENTH = set(range(10, 601, 10))  # 10% of the steps skipped
ON = {"enabled": True, "target_skip_rate": 0.01, "cooldown_steps": 100}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The service's own loop idle: these tests tick loops of their own."""
    return settings.model_copy(update={"autopilot_interval_s": IDLE_AUTOPILOT_S})


@pytest.fixture
def client(client: TestClient) -> TestClient:
    return after_first_autopilot_tick(client)


def test_a_change_is_filed_as_a_control_request_of_the_autopilot(store: Store) -> None:
    run = add_run(store, simulate(600, EVERY_TENTH))
    set_autopilot(store, run, ON)
    loop = AutopilotLoop(store, clock=lambda: 1000.0)
    loop.tick()
    (request,) = control_history(store, run)
    assert (request.source, request.requested_by) == (RequestSource.AUTOPILOT, "autopilot")
    assert request.status is RequestStatus.PENDING and request.values["growth_interval"] > 4
    assert request.note is not None and request.note.startswith("skipped-step rate 10.00%")
    row = get_autopilot(store, run)
    assert row is not None and row.decision is not None
    assert row.decision["action"] == "raise" and row.decision["request_id"] == request.id
    assert (row.decision["step"], row.decision["at"], row.decision["reason"]) == (
        600, 1000.0, request.note,
    )  # fmt: skip
    loop.tick()  # no new step: nothing is read or written
    assert get_autopilot(store, run) == row and len(control_history(store, run)) == 1
    write_steps(store, run, simulate(10, set(), first=601))
    loop.tick()  # its request is not applied yet
    after = get_autopilot(store, run)
    assert after is not None and after.decision is not None and after.decision["code"] == "pending"
    assert len(control_history(store, run)) == 1 and loop.ticks == 3


def test_a_change_and_its_decision_with_the_request_id_are_one_write(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = add_run(store, simulate(600, EVERY_TENTH))
    set_autopilot(store, run, ON)
    writes = []
    write = store.write

    @contextlib.contextmanager
    def counted() -> Iterator[Connection]:
        writes.append(1)
        with write() as conn:
            yield conn

    monkeypatch.setattr(store, "write", counted)
    AutopilotLoop(store, clock=lambda: 1000.0).tick()
    (request,) = control_history(store, run)
    row = get_autopilot(store, run)
    assert row is not None and row.decision is not None and row.decision["action"] == "raise"
    assert row.decision["request_id"] == request.id and len(writes) == 1


def test_an_autopilot_turned_off_while_it_decides_files_nothing(store: Store) -> None:
    run = add_run(store, simulate(600, EVERY_TENTH))
    set_autopilot(store, run, ON)
    ((row, facts),) = enabled_autopilots(store)  # read before the switch is turned off
    disable_autopilot(store, run)
    decision = AutopilotLoop(store).evaluate(row, facts, 1000.0)
    assert decision is not None and decision.values  # it decided on a change: not filed
    after = get_autopilot(store, run)
    assert after is not None and after.decision is None and control_history(store, run) == []


def test_a_refused_change_is_recorded_with_why(store: Store) -> None:
    run = add_run(store, simulate(600, EVERY_TENTH))
    set_autopilot(store, run, ON)
    ((row, facts),) = enabled_autopilots(store)  # read before the run ended
    end_run(store, run)
    AutopilotLoop(store).evaluate(row, facts, 1000.0)
    after = get_autopilot(store, run)
    assert after is not None and after.decision is not None and control_history(store, run) == []
    assert after.decision["action"] == "raise" and after.decision["request_id"] is None
    assert after.decision["refused"] == str(RunNotRunning(run, RunStatus.FINISHED))


def test_a_change_its_run_refuses_keeps_both_whys_in_the_history(
    store: Store, client: TestClient
) -> None:
    run = add_run(store, simulate(600, EVERY_TENTH))
    set_autopilot(store, run, ON)
    AutopilotLoop(store, clock=lambda: 1000.0).tick()
    (request,) = control_history(store, run)
    refusal = "growth_interval must be <= 2147483647"  # as the reporting rank would say it
    mark_rejected(store, request.id, reason=refusal, step=601)
    decision = client.get(f"/api/runs/{run}/autopilot").json()["decision"]
    (shown,) = client.get(f"/api/runs/{run}/control").json()["history"]
    assert (shown["id"], shown["status"], shown["source"]) == (request.id, "rejected", "autopilot")
    assert (shown["note"], shown["reason"]) == (decision["reason"], refusal)
    assert shown["note"].startswith("skipped-step rate 10.00%")


def test_at_its_upper_bound_it_gives_up_and_says_why(store: Store, client: TestClient) -> None:
    run = add_run(store, simulate(600, EVERY_TENTH))
    set_autopilot(store, run, {**ON, "max_growth_interval": 4})
    loop = AutopilotLoop(store)
    loop.tick()
    row = get_autopilot(store, run)
    assert (
        row is not None
        and row.state is AutopilotState.GAVE_UP
        and control_history(store, run) == []
    )
    body = client.get(f"/api/runs/{run}/autopilot").json()
    assert (body["enabled"], body["state"]) == (True, "gave_up")
    assert body["reason"] == body["decision"]["reason"]
    assert "growth_interval at its upper bound 4" in body["reason"]
    write_steps(store, run, simulate(100, set(range(601, 701, 10)), first=601))
    loop.tick()  # stopped: it evaluates the run no more
    assert get_autopilot(store, run) == row


def test_a_run_that_ended_is_left_alone(store: Store) -> None:
    run = add_run(store, simulate(600, EVERY_TENTH))
    set_autopilot(store, run, ON)
    end_run(store, run)
    AutopilotLoop(store).tick()
    row = get_autopilot(store, run)
    assert row is not None and row.decision is None and control_history(store, run) == []


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (
            OSError("disk I/O error"),
            "scalewatch: the autopilot's evaluation failed; it tries again",
        ),
        # A PostgreSQL server restarting under the service: one line, as the routes say it,
        # where the autopilot logged a traceback of 60 lines.
        (
            OperationalError("SELECT 1", {}, ConnectionRefusedError("refused")),
            "scalewatch: the autopilot cannot read the store (ConnectionRefusedError);"
            " it tries again",
        ),
    ],
)
def test_a_failing_store_is_logged_once_until_it_works_again(
    store: Store, caplog: pytest.LogCaptureFixture, failure: Exception, said: str
) -> None:
    class Flaky(AutopilotLoop):
        failures = 3

        def tick(self) -> None:
            if self.failures:
                self.failures -= 1
                raise failure
            super().tick()
            if self.ticks == 2:
                raise asyncio.CancelledError  # ends the loop, as the lifespan's end does

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await run_loop(Flaky(store), 0.001)

    with caplog.at_level(logging.WARNING, logger="scalewatch.app.autopilot"):
        asyncio.run(main())
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [said, "scalewatch: the autopilot evaluates runs again"]
    if isinstance(failure, OperationalError):
        assert "Traceback" not in caplog.text


RULES_FILE = """
[[autopilot]]
run = "bert-*"
target_skip_rate = 0.01
cooldown_steps = 100

[[autopilot]]
run = "*"
target_skip_rate = 0.02
min_scale = 2048.0
"""


def test_the_rules_files_autopilot_tables_turn_it_on_for_the_runs_they_name(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    rules = parse_rules(RULES_FILE).autopilots
    bert = add_run(store, simulate(600, EVERY_TENTH), name="bert-large")
    capped = {**CONTROL, "max_scale": 1024.0}  # under its rule's floor: refused
    gpt = create_run(store, name="gpt", world_size=2, config={}, control=capped).id
    write_steps(store, gpt, simulate(600, EVERY_TENTH))
    off = add_run(store, simulate(600, EVERY_TENTH), name="bert-base")
    set_autopilot(store, off, {"enabled": False, "target_skip_rate": 0.01})  # a person's: kept
    loop = AutopilotLoop(store, rules=rules)
    with caplog.at_level(logging.WARNING, logger="scalewatch.app.autopilot"):
        loop.tick()
    row = get_autopilot(store, bert)
    assert row is not None and row.enabled and row.target_skip_rate == 0.01
    assert row.cooldown_steps == 100 and row.min_growth_interval == 4  # the run's interval
    (request,) = control_history(store, bert)  # and evaluated in the same tick
    assert request.source is RequestSource.AUTOPILOT
    assert get_autopilot(store, gpt) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"scalewatch: autopilot rule '*' not applied to run {gpt}: " + str(_refusal(store, gpt))
    ]
    off_row = get_autopilot(store, off)
    assert off_row is not None and not off_row.enabled
    disable_autopilot(store, bert)
    loop.tick()  # turned off by a person: the rule does not turn it on again
    after = get_autopilot(store, bert)
    assert after is not None and not after.enabled and len(caplog.records) == 1


def _refusal(store: Store, run: int) -> Exception:
    try:
        set_autopilot(store, run, {"enabled": True, "target_skip_rate": 0.02, "min_scale": 2048.0})
    except ControlValidationError as error:  # the store's own refusal, to compare with
        return error
    raise AssertionError("accepted")


@pytest.mark.parametrize(
    ("table", "line", "reason"),
    [
        ("target_skip_rate = 0.01", 2, "autopilot 1: run: a glob of run names is required"),
        ('run = "*"\ntarget_skip_rate = 2.0', 4, "autopilot 1: target_skip_rate must be"),
        ('run = "*"\ntarget_skip_rate = 0.1\ncooldown = 5', 5, "autopilot 1: unknown field"),
        ('run = "*"\ntarget_skip_rate = 0.1\nmax_growth_interval = 0', 5, "autopilot 1: max_"),
    ],
)
def test_a_bad_autopilot_table_is_refused_with_its_line(table: str, line: int, reason: str) -> None:
    with pytest.raises(RulesFileError) as refused:
        parse_rules(f"\n[[autopilot]]\n{table}\n", source="rules.toml")
    assert refused.value.line == line
    assert str(refused.value).startswith(f"rules.toml, line {line}: {reason}")
