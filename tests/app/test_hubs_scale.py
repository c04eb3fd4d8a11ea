"""The service's reads of the store for live streams grow with the runs streamed, not with
the streams: one hub a run however many streams it has, and one poller a store."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from collections import Counter
from typing import Any

import pytest

from scalewatch.app.live import hubs as hubs_module
from scalewatch.app.live.hubs import Chunk, Hubs
from scalewatch.store.engine import Store
from scalewatch.store.queries import step_rows_after
from tests._helpers.service import add_run, simulate
from tests.app.test_stream_coalesce import PACING


def test_streams_of_a_run_share_its_hub_and_its_reads(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    crowded, alone = (add_run(store, simulate(5, set()), name=f"run{i}") for i in range(2))
    reads: Counter[int] = Counter()
    read_new = hubs_module._read_new

    def counted(store: Store, run_id: int, after: int, **kwargs: Any) -> Any:
        reads[run_id] += 1
        return read_new(store, run_id, after, **kwargs)

    monkeypatch.setattr(hubs_module, "_read_new", counted)
    pacing = dataclasses.replace(PACING, poll_s=0.01, listen_fallback_s=0.01)

    async def streams() -> None:
        hubs = Hubs(store, pacing)
        try:
            twenty = [hubs.join(crowded, 5) for _ in range(20)]
            one = hubs.join(alone, 5)
            assert len(hubs) == 2 and all(hub is twenty[0] for hub in twenty)
            deadline = time.monotonic() + 20
            while reads[alone] < 20:
                assert time.monotonic() < deadline, reads
                await asyncio.sleep(0.01)
            # Twenty streams of one run cost what one stream of another does.
            assert reads[crowded] <= reads[alone] + 3, reads
            # The store tells both hubs of new steps through one poller.
            listener = store.listener
            assert listener is not None and set(listener.waiters) == {crowded, alone}
            assert not one.failed and not twenty[0].failed
        finally:
            hubs.close()

    asyncio.run(streams())


def test_a_buffered_chunk_is_one_object_the_collector_walks(store: Store) -> None:
    """A hub keeps 1250 chunks a run: their parts hold nothing the collector must walk."""
    run = add_run(store, simulate(40, set()))
    chunk = Chunk(step_rows_after(store, run, 0, limit=40))
    gap = Chunk.gap(40, 90)
    gc.collect()  # a tuple of ints is no longer tracked once a pass has seen it
    assert list(chunk.steps) == list(range(1, 41)) and list(gap.steps) == [90]
    parts = (chunk.steps, chunk.data, chunk.read_at, gap.steps, gap.data)
    assert not any(gc.is_tracked(part) for part in parts)
