"""Steps a job posts reach the run's live streams from the ingest that stored them, not
read back from the store: the same events, each once, in order."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import scalewatch.app.live.hubs as hubs_module
from scalewatch.app.live.hubs import Chunk, Hub, Pacing
from scalewatch.app.live.sse import plain_step_events, step_events
from scalewatch.store import notify, queries
from scalewatch.store import runs as store_runs
from scalewatch.store.engine import Store, open_store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.runs import Appended, write_step_values
from scalewatch.store.states import RunStatus
from scalewatch.store.step_schema import STEP_FIELDS, Kind
from scalewatch.telemetry._batches import items
from tests._helpers.service import add_run, auth, simulate
from tests._helpers.serving import Event, events, serve_on_thread
from tests.app.test_ingest import opening, step_commands
from tests.app.test_stream_encoding import row as read_row


def row(step: int, **changes: Any) -> tuple[Any, ...]:
    """A step's values as the ingest stores them: flags as booleans."""
    values = read_row(step, **changes)
    return tuple(
        bool(v) if f.kind is Kind.BOOL else v for f, v in zip(STEP_FIELDS, values, strict=True)
    )


# The hubs' own polls held off: what a hub holds came from the ingest or from its first read.
SLOW = Pacing(
    poll_s=30.0,
    listen_fallback_s=30.0,
    buffered_steps=1000,
    behind_page=100,
    behind_pages=4,
    max_lag_s=60.0,
)


def test_posted_steps_stream_as_the_store_would_send_them(
    both_backends_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five batches posted while a stream follows the run: every step once, in order, the
    same events a stream that reads the finished run from the store gets. On SQLite the
    store's watcher and the hub's own poll are held off (30 s) once the hub's first read is
    done, so the steps can only have come from the ingest, and the hub read none back.
    PostgreSQL's hubs read the steps its NOTIFY announces (the ingest still asks the store
    for the rows it appended, for the alert evaluator)."""
    read_back: list[int] = []
    asked_back: list[bool] = []
    real_write = store_runs.write_step_values

    def write(*args: Any, appended: bool = False, **kwargs: Any) -> Any:
        asked_back.append(appended)
        return real_write(*args, appended=appended, **kwargs)

    hub_read = threading.Event()
    real_read = queries.step_rows_after

    def counted(*args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        rows = real_read(*args, **kwargs)
        read_back.extend(r[0] for r in rows)
        hub_read.set()
        return rows

    monkeypatch.setattr(queries, "step_rows_after", counted)
    monkeypatch.setattr(store_runs, "write_step_values", write)
    monkeypatch.setattr(notify, "SQLITE_POLL_S", 30.0)
    # The watcher's first look (all its runs woken) is a read at a time of its own.
    monkeypatch.setattr(notify.CommitWatcher, "_wake_all", lambda self: None)
    with open_store(both_backends_url) as store:
        token = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    with (
        serve_on_thread(both_backends_url, poll_s=30.0, stream_listen_fallback_s=30.0) as server,
        httpx.Client(base_url=server, timeout=10) as http,
    ):
        opened = http.post("/api/ingest/runs", json=opening(uuid.uuid4().hex), headers=token)
        run = opened.json()["id"]
        first = {"sequence": 1, "items": items(step_commands(1, 20), reason="")}
        assert http.post(f"/api/ingest/runs/{run}/batches", json=first, headers=token).is_success
        live = []
        with http.stream("GET", f"/api/runs/{run}/stream", headers={"Last-Event-ID": "20"}) as r:
            stream = events(r)
            assert hub_read.wait(10)  # the hub's first read: nothing after step 20
            assert read_back == []
            for batch in range(2, 7):
                body = {
                    "sequence": batch,
                    "items": items(step_commands(batch * 20 - 19, 20), reason=""),
                }
                answer = http.post(f"/api/ingest/runs/{run}/batches", json=body, headers=token)
                assert answer.json()["stored"] is True
                live += [next(stream) for _ in range(20)]
        assert [int(e.id or 0) for e in live] == list(range(21, 121))
        assert asked_back == [True] * 6
        if both_backends_url.startswith("sqlite"):
            assert read_back == []
        end = {"sequence": 7, "end": "finished"}
        assert http.post(f"/api/ingest/runs/{run}/batches", json=end, headers=token).is_success
        with http.stream("GET", f"/api/runs/{run}/stream", headers={"Last-Event-ID": "20"}) as r:
            replayed = [e for e in events(r) if e.event == "step"]
    assert [(e.id, e.data) for e in live] == [(e.id, e.data) for e in replayed]


def test_a_hub_keeps_steps_handed_over_during_its_read_once(tmp_path: Path) -> None:
    """The ingest hands steps 6-8 over while the hub's read, which finds 6-10, is on its
    way: the hub holds 6-10, each once."""
    url = f"sqlite:///{tmp_path / 'scalewatch.db'}"
    with open_store(url) as store:
        run = add_run(store, simulate(10, set()))
        rows = queries.step_rows_after(store, run, 0)
        assert asyncio.run(_handed_over_during_read(store, run, rows)) == list(range(6, 11))


async def _handed_over_during_read(store: Store, run: int, rows: list[Any]) -> list[int]:
    hub = Hub(store, run, 5, SLOW)
    loop = asyncio.get_running_loop()
    taken = threading.Event()

    def take() -> None:
        hub.take(5, Chunk(rows[5:8]))
        taken.set()

    def read(*_: Any, **__: Any) -> tuple[str, list[Chunk]]:
        loop.call_soon_threadsafe(take)
        assert taken.wait(10)
        return RunStatus.RUNNING, [Chunk(rows[5:10])]

    real = hubs_module._read_new
    hubs_module._read_new = read  # type: ignore[assignment]
    try:
        hub.start()
        while hub.after < 10:
            await asyncio.wait_for(hub.tick.wait(), 10)
    finally:
        hubs_module._read_new = real
        assert hub.task is not None
        hub.task.cancel()
    return [step for chunk in hub.chunks for step in chunk.steps]


def test_a_hub_takes_only_the_steps_that_follow_its_own() -> None:
    """Steps handed over after a step the hub does not hold yet (it is behind) wait for
    its read; so do they once its run has ended."""
    hub = Hub(None, 1, 5, SLOW)  # type: ignore[arg-type]
    hub.take(7, Chunk([row(8), row(9)]))
    assert hub.after == 5 and hub.chunks == []
    hub.take(5, Chunk([row(6), row(7)]))
    assert hub.after == 7 and [c.steps for c in hub.chunks] == [(6, 7)]
    assert Chunk([row(6), row(7)]).since(6) is not None
    assert Chunk([row(6), row(7)]).since(7) is None
    part = Chunk([row(6), row(7), row(8)]).since(6)
    assert part is not None and part.steps == (7, 8)
    assert part.data == Chunk([row(7), row(8)]).data
    hub.ended = hubs_module.Ended(RunStatus.FINISHED)
    hub.take(7, Chunk([row(8)]))
    assert hub.after == 7


@pytest.mark.parametrize(
    ("changes", "plain"),
    [
        ({}, True),
        ({"loss": None, "grad_norm": 3.5, "inf_ranks": "0,3", "overflow": True}, True),
        ({"loss": -0.0}, False),  # SQLite reads -0.0 back as 0.0
        ({"scale_after": -0.0}, False),
        ({"loss": math.nan}, False),  # SQLite reads NaN back as NULL
        ({"grad_norm": math.inf}, False),
        ({"lr_groups": "[[0.1]]"}, False),
        ({"inf_ranks": "01"}, False),
    ],
)
def test_a_plain_page_is_the_page_the_store_gives_back(
    both_backends_url: str, changes: dict[str, Any], plain: bool
) -> None:
    """Rows the ingest would hand over are encoded as the same rows read back from the
    store are; rows that the store would change are not handed over."""
    with open_store(both_backends_url) as store:
        run = add_run(store, simulate(2, set()))
        values = [row(3, **changes), row(4)]
        appended = write_step_values(store, run, values, appended=True)
        assert isinstance(appended, Appended) and appended.after == 2
        events = plain_step_events(appended.rows)
        assert (events is not None) is plain
        if plain:
            assert events == step_events(queries.step_rows_after(store, run, 2))
        # Written again, or out of order: nothing is handed over.
        assert write_step_values(store, run, [row(4)], appended=True) is None
        assert write_step_values(store, run, [row(6), row(5)], appended=True) is None
        assert write_step_values(store, run, [row(7)]) is None  # not asked for


def test_a_stream_fed_by_the_ingest_still_tells_of_control_requests(tmp_path: Path) -> None:
    """While a job posts batch after batch (each handed over, none read back), the hub's
    fallback poll still comes when due: a control request filed meanwhile reaches the
    stream within seconds, not once the job stops posting; and the run's end, which no
    step announces, ends the stream."""
    url = f"sqlite:///{tmp_path / 'scalewatch.db'}"
    with open_store(url) as store:
        token = auth(create_identity(store, "job-42", Role.WRITER, by="test").token)
    with (
        serve_on_thread(url, poll_s=0.05, stream_listen_fallback_s=1.0) as server,
        httpx.Client(base_url=server, timeout=10) as http,
    ):
        run = http.post("/api/ingest/runs", json=opening(uuid.uuid4().hex), headers=token).json()[
            "id"
        ]
        first = {"sequence": 1, "items": items(step_commands(1, 20), reason="")}
        assert http.post(f"/api/ingest/runs/{run}/batches", json=first, headers=token).is_success
        with http.stream("GET", f"/api/runs/{run}/stream", headers={"Last-Event-ID": "20"}) as r:
            stream = events(r, opened=True)
            asked = http.post(
                f"/api/runs/{run}/control", json={"growth_interval": 3}, headers=auth("t")
            )
            assert asked.status_code == 202, asked.text
            deadline = time.monotonic() + 10
            batch, seen = 1, list[Event]()
            while not any(e.event == "control" for e in seen):
                assert time.monotonic() < deadline, "no control event while batches flowed"
                batch += 1
                steps = items(step_commands(batch * 20 - 19, 20), reason="")
                body = {"sequence": batch, "items": steps}
                assert http.post(
                    f"/api/ingest/runs/{run}/batches", json=body, headers=token
                ).is_success
                while sum(e.event == "step" for e in seen) < (batch - 1) * 20:
                    seen.append(next(stream))
            # The run's end reaches the stream too, though no step announces it.
            end = {"sequence": batch + 1, "end": "finished"}
            assert http.post(f"/api/ingest/runs/{run}/batches", json=end, headers=token).is_success
            rest = list(stream)  # the stream ends with the run
            assert [e.event for e in rest if e.event != "control"] == ["end"]
    control = next(e for e in seen if e.event == "control")
    assert json.loads(control.data)["values"] == {"growth_interval": 3}
