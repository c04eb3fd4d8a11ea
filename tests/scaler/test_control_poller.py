"""The control poller (scalewatch.telemetry._control_poller): the run's pending requests to
the scaler's inbox, each once; one that breaks a rule settled as rejected, never handed on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scalewatch._control.inbox import ControlInbox
from scalewatch.store import Store, open_store
from scalewatch.store.control import request_control
from scalewatch.store.runs import create_run
from scalewatch.store.schema import control_requests
from scalewatch.telemetry._control_poller import ControlPoller
from scalewatch.telemetry._queue import CommandQueue, WriteOutcome
from tests._helpers.stored import CONTROL, db_url
from tests._helpers.waiting import wait_for


@dataclass
class WriterSide:
    """What the poller reads of the writer: its store, its run and the store's file."""

    store: Store
    run_id: int
    file_id: tuple[int, int] | None = None


@pytest.fixture
def polled(tmp_path: Path) -> Iterator[tuple[Store, int, ControlInbox, CommandQueue]]:
    store = open_store(db_url(tmp_path / "sw.db"))
    run = create_run(store, name="polled", world_size=1, config={}, control=CONTROL)
    inbox, queue = ControlInbox(), CommandQueue(max_pending=10, batch=10)
    poller = ControlPoller(WriterSide(store, run.id), queue, inbox, interval_s=0.01)  # type: ignore[arg-type]
    poller.thread.start()
    yield store, run.id, inbox, queue
    poller.stop.set()
    poller.thread.join(10)
    store.close()


def test_a_pending_request_reaches_the_inbox_once(
    polled: tuple[Store, int, ControlInbox, CommandQueue],
) -> None:
    store, run_id, inbox, _ = polled
    row = request_control(store, run_id, {"growth_interval": 100}, requested_by="test")
    wait_for(lambda: len(inbox) == 1, 10, "the request in the inbox")
    (update,) = inbox.take_all()
    assert (update.request_id, dict(update.values)) == (row.id, {"growth_interval": 100})
    # The first stays pending in the store: the poll that hands on the second sees both.
    second = request_control(store, run_id, {"growth_interval": 50}, requested_by="test")
    wait_for(lambda: len(inbox) >= 1, 10, "the second request in the inbox")
    assert [update.request_id for update in inbox.take_all()] == [second.id]


def test_a_request_written_past_validation_is_settled_not_handed_on(
    polled: tuple[Store, int, ControlInbox, CommandQueue],
) -> None:
    store, run_id, inbox, queue = polled
    with store.write() as conn:
        inserted = conn.execute(
            control_requests.insert().values(
                run_id=run_id,
                values={"growth_factor": 0.5},
                source="api",
                requested_by="elsewhere",
                requested_at=time.time(),
                status="pending",
            )
        )
    request_id = inserted.inserted_primary_key[0]
    wait_for(queue.pending, 10, "the refusal queued for the writer")
    (command,) = queue.take()
    assert isinstance(command, WriteOutcome) and command.step is None
    assert command.outcome.request_id == request_id and not command.outcome.applied
    assert "growth_factor" in (command.outcome.reason or "")
    assert not inbox
