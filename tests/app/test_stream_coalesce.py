"""A live stream that falls behind jumps to the newest steps, with an ``event: coalesced``
naming those it left out, instead of replaying a backlog; the store keeps every step."""

from __future__ import annotations

import json
import time

from scalewatch.app.live.hubs import STEP_PAGE, Chunk, Hub, Pacing, _read_new
from scalewatch.store.engine import Store
from scalewatch.store.queries import step_rows_after
from tests._helpers.service import add_run, simulate

PACING = Pacing(
    poll_s=0.05,
    listen_fallback_s=1.0,
    buffered_steps=100_000,
    behind_page=5000,
    behind_pages=8,
    max_lag_s=2.0,
)


def _chunk(store: Store, run: int, after: int, until: int, age_s: float) -> Chunk:
    chunk = Chunk(step_rows_after(store, run, after, until=until, limit=until - after))
    chunk.read_at = time.monotonic() - age_s
    return chunk


def _events(data: list[bytes]) -> list[tuple[str, dict[str, object]]]:
    out = []
    for block in b"".join(data).decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def _hub_with(store: Store, run: int, ages: list[tuple[int, int, float]]) -> Hub:
    hub = Hub(store, run, ages[0][0], PACING)
    for after, until, age in ages:
        hub._keep(_chunk(store, run, after, until, age))
    return hub


def test_a_live_stream_behind_by_more_than_max_lag_skips_to_the_fresh_chunks(
    store: Store,
) -> None:
    run = add_run(store, simulate(400, set()))
    hub = _hub_with(store, run, [(0, 100, 9.0), (100, 200, 5.0), (200, 300, 1.0), (300, 400, 0.0)])
    cursor, data = hub.since(50, live=True)
    events = _events(data)
    assert cursor == 400
    assert events[0] == ("coalesced", {"after": 50, "to": 200})
    assert [data["step"] for kind, data in events[1:]] == list(range(201, 401))
    assert {kind for kind, _ in events[1:]} == {"step"}


def test_a_stream_catching_up_or_within_the_lag_gets_every_step(store: Store) -> None:
    run = add_run(store, simulate(400, set()))
    hub = _hub_with(store, run, [(0, 100, 9.0), (100, 200, 5.0), (200, 300, 1.0), (300, 400, 0.0)])
    # Not yet caught up (a new stream, or one resuming): every buffered step.
    _, data = hub.since(50, live=False)
    assert [data["step"] for _, data in _events(data)] == list(range(51, 401))
    # Live, and its next events fresh: nothing skipped.
    _, data = hub.since(250, live=True)
    assert [data["step"] for _, data in _events(data)] == list(range(251, 401))


def test_when_every_chunk_is_old_the_newest_one_is_still_sent(store: Store) -> None:
    run = add_run(store, simulate(300, set()))
    hub = _hub_with(store, run, [(0, 100, 30.0), (100, 200, 20.0), (200, 300, 10.0)])
    cursor, data = hub.since(0, live=True)
    events = _events(data)
    assert cursor == 300
    assert events[0] == ("coalesced", {"after": 0, "to": 200})
    assert [data["step"] for _, data in events[1:]] == list(range(201, 301))


def test_a_late_poll_reads_the_newest_page_after_a_gap(store: Store) -> None:
    total = 3 * STEP_PAGE + 500
    run = add_run(store, simulate(total, set()))
    status, chunks = _read_new(store, run, 0, newest=True)
    assert status == "running"
    gap, page = chunks
    assert _events([gap.data]) == [("coalesced", {"after": 0, "to": total - STEP_PAGE})]
    assert list(page.steps) == list(range(total - STEP_PAGE + 1, total + 1))
    # An on-time poll reads the whole backlog, a page a chunk.
    _, chunks = _read_new(store, run, 0)
    assert [step for chunk in chunks for step in chunk.steps] == list(range(1, total + 1))
    # A late poll with less than a page to read skips nothing.
    _, chunks = _read_new(store, run, total - 10, newest=True)
    assert [list(chunk.steps) for chunk in chunks] == [list(range(total - 9, total + 1))]
