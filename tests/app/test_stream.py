from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import scalewatch.app.live.hubs as hubs_module
from scalewatch.app.live.sse import sse_event
from scalewatch.store.engine import Store, open_store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.runs import end_run
from tests._helpers.service import add_run, auth, simulate
from tests._helpers.serving import events, serve_on_thread

WRITER = """
import sys, time
from scalewatch.store.engine import open_store
from scalewatch.store.runs import end_run, heartbeat, write_steps
from tests._helpers.service import simulate
url, run = sys.argv[1], int(sys.argv[2])
store = open_store(url)
heartbeat(store, run)  # as a job's writer does: the run stays live however long this took
print("ready", flush=True)
for line in sys.stdin:
    word, _, arg = line.strip().partition(" ")
    if word == "write":
        step = int(arg)
        write_steps(store, run, simulate(1, set(), first=step))
    elif word == "end":
        end_run(store, run)
    print("done", flush=True)
"""


@pytest.fixture
def db_url(both_backends_url: str) -> str:
    """Live streams on both backends, each told of new steps by the store."""
    return both_backends_url


class Writer:
    """Another process that writes steps to the store, one command at a time."""

    def __init__(self, url: str, run: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(run)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._reply() == "ready"

    def _reply(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        assert self._reply() == "done"

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def test_live_steps_resume_and_end(server: str, db_url: str, store: Store) -> None:
    run = add_run(store, simulate(5, set()))
    writer = Writer(db_url, run)
    try:
        with httpx.Client(base_url=server, timeout=5) as http:
            with http.stream("GET", f"/api/runs/{run}/stream") as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                stream = events(response)
                sent = time.monotonic()
                writer.send("write 6")
                first = next(stream)
                latency = time.monotonic() - sent
                assert (first.event, first.id) == ("step", "6")
                assert json.loads(first.data)["step"] == 6
                assert latency < 1.0

            headers = {"Last-Event-ID": "3"}
            with http.stream("GET", f"/api/runs/{run}/stream", headers=headers) as response:
                stream = events(response)
                assert [next(stream).id for _ in range(3)] == ["4", "5", "6"]
                writer.send("write 7")
                assert next(stream).id == "7"
                writer.send("end")
                end = next(stream)
                assert (end.event, json.loads(end.data)) == ("end", {"status": "finished"})
                assert list(stream) == []
    finally:
        writer.close()


def test_the_store_tells_a_stream_of_new_steps_without_a_poll(db_url: str) -> None:
    """PostgreSQL's LISTEN/NOTIFY, a SQLite file's one poller of every streamed run: a step
    another process writes reaches the stream within a second, though the stream would
    poll the store only every 30 s."""
    url = db_url
    with open_store(url) as store:
        run = add_run(store, simulate(5, set()))
    writer = Writer(url, run)
    try:
        with (
            serve_on_thread(url, poll_s=30.0, stream_listen_fallback_s=30.0) as server,
            httpx.Client(base_url=server, timeout=5) as http,
            http.stream("GET", f"/api/runs/{run}/stream") as response,
        ):
            stream = events(response)
            for step in (6, 7, 8):
                sent = time.monotonic()
                writer.send(f"write {step}")
                event = next(stream)
                assert (event.event, event.id) == ("step", str(step))
                assert time.monotonic() - sent < 1.0
    finally:
        writer.close()


def test_streams_far_behind_share_each_page_and_miss_nothing(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams behind what the hub keeps read aligned pages that are read and encoded once,
    whatever the number of streams: falling behind must not multiply the service's work."""
    reads: list[tuple[int, int]] = []
    read_page = hubs_module._read_page

    def counted(store: Store, run_id: int, after: int, until: int) -> object:
        reads.append((after, until))
        return read_page(store, run_id, after, until)

    monkeypatch.setattr(hubs_module, "_read_page", counted)
    run = add_run(store, simulate(1000, {10, 500}))
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            serve_on_thread(
                db_url,
                poll_s=0.05,
                stream_buffered_steps=100,
                stream_behind_page=64,
                stream_behind_pages=100,  # nothing evicted: exact count
            )
        )
        http = stack.enter_context(httpx.Client(base_url=server, timeout=10))
        # The first stream starts the hub at the last step; the others resume from the start.
        stack.enter_context(http.stream("GET", f"/api/runs/{run}/stream"))
        behind = [
            events(stack.enter_context(http.stream("GET", f"/api/runs/{run}/stream?after=0")))
            for _ in range(5)
        ]
        for stream in behind:
            ids = []
            for event in stream:
                ids.append(int(event.id or 0))
                if ids[-1] == 1000:
                    break
            assert ids == list(range(1, 1001))
            assert event.event == "step"
    assert sorted(reads) == [(first, min(first + 64, 1000)) for first in range(0, 1000, 64)]


def test_a_stream_resuming_past_the_last_step_keeps_other_streams_live(
    server: str, db_url: str, store: Store
) -> None:
    """The first stream of a run starts its one poller: from a point past the last step it
    would read nothing new for anyone, and send the others through page after empty page."""
    run = add_run(store, simulate(5, set()))
    writer = Writer(db_url, run)
    try:
        with contextlib.ExitStack() as stack:
            http = stack.enter_context(httpx.Client(base_url=server, timeout=5))
            far = f"/api/runs/{run}/stream?after={2**63 - 1}"
            first = events(stack.enter_context(http.stream("GET", far)))
            second = events(stack.enter_context(http.stream("GET", f"/api/runs/{run}/stream")))
            for step in (6, 7):
                writer.send(f"write {step}")
                assert next(first).id == next(second).id == str(step)
    finally:
        writer.close()


def test_stream_of_a_finished_run_golden_body(client: TestClient, store: Store) -> None:
    records = simulate(3, {2})
    records[2] = dataclasses.replace(records[2], schedule_drift=1)  # stepped after step 2
    run = add_run(store, records)
    end_run(store, run)

    body = client.get(f"/api/runs/{run}/stream?after=1").text

    assert body == (
        f"retry: 1000\n: streaming run {run} after step 1\n\n"
        'id: 2\nevent: step\ndata: {"step":2,"wall_time":1700000000.5,"scale":65536.0,'
        '"overflow":true,"skipped":true,"inf_ranks":[1],"scale_after":32768.0,'
        '"growth_tracker":0,"growth_interval":4,"growth_factor":2.0,"backoff_factor":0.5,'
        '"control_version":0,"loss":null,"loss_nonfinite_ranks":[],"params_omitted":0,'
        '"lr":null,"lr_groups":null,"schedule_drift":null,"grad_norm":null,"loss_spike":false,"grad_norm_spike":false,"spike_skipped":false}\n\n'
        'id: 3\nevent: step\ndata: {"step":3,"wall_time":1700000000.75,"scale":32768.0,'
        '"overflow":false,"skipped":false,"inf_ranks":[],"scale_after":32768.0,'
        '"growth_tracker":1,"growth_interval":4,"growth_factor":2.0,"backoff_factor":0.5,'
        '"control_version":0,"loss":null,"loss_nonfinite_ranks":[],"params_omitted":0,'
        '"lr":null,"lr_groups":null,"schedule_drift":1,"grad_norm":null,"loss_spike":false,"grad_norm_spike":false,"spike_skipped":false}\n\n'
        'event: end\ndata: {"status":"finished"}\n\n'
    )


def test_bad_last_event_id_is_422(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(3, set()))
    response = client.get(f"/api/runs/{run}/stream", headers={"Last-Event-ID": "abc"})
    assert response.status_code == 422


def test_sse_event_format() -> None:
    assert sse_event("end", {"status": "finished"}) == 'event: end\ndata: {"status":"finished"}\n\n'
    assert sse_event("step", {"step": 7}, 7) == 'id: 7\nevent: step\ndata: {"step":7}\n\n'


def test_a_control_request_filed_once_the_stream_opened_reaches_it(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request filed as soon as the stream's first bytes arrive is sent on it as pending,
    though the new hub's first read of the requests is held up (here until the request is
    filed, or for a second): the stream opens only once that read is done. The run is
    ended after 10 s at the latest, which rejects the request: a stream that missed the
    filing sees it first as rejected."""
    run = add_run(store, simulate(5, set()))
    filed = threading.Event()
    real_marks = hubs_module._control_marks

    def held(*args: Any) -> Any:
        filed.wait(1.0)
        return real_marks(*args)

    monkeypatch.setattr(hubs_module, "_control_marks", held)
    ender = threading.Timer(10.0, end_run, (store, run))
    with (
        serve_on_thread(db_url, poll_s=0.05) as server,
        httpx.Client(base_url=server, timeout=30) as http,
        http.stream("GET", f"/api/runs/{run}/stream") as response,
    ):
        stream = events(response, opened=True)
        url = f"/api/runs/{run}/control"
        asked = http.post(url, json={"growth_interval": 9}, headers=auth("t"))
        filed.set()
        ender.start()
        assert asked.status_code == 202
        first = json.loads(next(e for e in stream if e.event == "control").data)
    ender.cancel()
    assert first["status"] == "pending"


def test_a_control_event_names_who_asked(server: str, store: Store) -> None:
    run = add_run(store, simulate(5, set()))
    token = create_identity(store, "olga", Role.OPERATOR, by="test").token
    url = f"/api/runs/{run}/control"
    # A hub reads control changes every 5th poll; a PostgreSQL hub with no new steps polls
    # once a second (stream_listen_fallback_s), so the event may take 5 s and more on a busy
    # machine: the read waits for it longer than that.
    with (
        httpx.Client(base_url=server, timeout=30) as http,
        http.stream("GET", f"/api/runs/{run}/stream") as response,
    ):
        stream = events(response, opened=True)
        asked = http.post(
            url, json={"growth_interval": 9}, headers={"Authorization": f"Bearer {token}"}
        )
        assert asked.status_code == 202
        event = next(e for e in stream if e.event == "control")
        body = json.loads(event.data)
        assert (body["requested_by"], body["source"]) == ("olga", "api")
