"""New steps reach the waiters of their run, and only theirs: PostgreSQL's LISTEN
connection (``Listener``) and a SQLite file's commit watcher (``CommitWatcher``), one per
store while it has waiters; an in-memory store has none."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from scalewatch.store import RunRef, Store, notify, open_store
from scalewatch.store.runs import create_run, write_steps
from tests._helpers.records import step_record
from tests._helpers.stored import CONTROL
from tests._helpers.waiting import wait_for

T = TypeVar("T")


def _run(scenario: Callable[[], Awaitable[T]]) -> T:
    """``scenario`` on an event loop of its own thread: the test's thread may be inside a
    loop that an earlier test of this worker left running."""

    async def main() -> T:
        return await scenario()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def _second_run(store: Store) -> RunRef:
    return create_run(store, name="other", world_size=1, config={}, control=CONTROL)


def test_a_step_wakes_the_waiters_of_its_run_and_no_other(store: Store, run: RunRef) -> None:
    other = _second_run(store)

    async def scenario() -> tuple[bool, bool, bool]:
        # The other run's waiter first: the watcher starts with it, so its first pass knows
        # that run's last step. A run first seen at a later pass (a waiter that subscribed
        # after the first one) reads as moved at the next commit, which here would be the
        # step written to this run, and wake it for nothing.
        theirs = notify.subscribe(store, other.id)
        mine, also_mine = notify.subscribe(store, run.id), notify.subscribe(store, run.id)
        assert mine is not None and also_mine is not None and theirs is not None
        watcher = store.listener
        assert watcher is not None
        expected = (
            notify.Listener if store.engine.dialect.name == "postgresql" else (notify.CommitWatcher)
        )
        assert type(watcher) is expected
        await asyncio.to_thread(wait_for, watcher.listening.is_set, 30, "the watcher to start")
        # Wake-ups of the start itself (every run reads as moved at the watcher's first
        # passes) are spent first: until each waiter stays quiet for 1 s (a busy machine's
        # watcher may take a few tenths for its first read).
        for waiter in (mine, also_mine, theirs):
            while await waiter.wait(1.0):
                pass
        await asyncio.to_thread(write_steps, store, run.id, [step_record(1)])
        woken = await mine.wait(10), await also_mine.wait(10)
        untouched = await theirs.wait(0.5)
        for waiter in (mine, also_mine, theirs):
            notify.unsubscribe(store, waiter)
        return woken[0], woken[1], untouched

    woken, also_woken, untouched = _run(scenario)
    assert woken and also_woken
    assert not untouched
    assert store.listener is None  # the store's last waiter took its watcher with it


def test_a_waiter_keeps_a_wake_up_that_came_while_its_reader_was_busy(
    store: Store, run: RunRef
) -> None:
    async def scenario() -> bool:
        waiter = notify.subscribe(store, run.id)
        assert waiter is not None and store.listener is not None
        await asyncio.to_thread(wait_for, store.listener.listening.is_set, 30, "the watcher")
        await waiter.wait(0.05)
        await asyncio.to_thread(write_steps, store, run.id, [step_record(1)])
        await asyncio.to_thread(wait_for, lambda: waiter._event.is_set(), 10, "the wake-up")
        kept = await waiter.wait(1)  # nobody was waiting when it came: kept, at once
        notify.unsubscribe(store, waiter)
        return kept

    assert _run(scenario)


def test_an_in_memory_store_has_no_watcher() -> None:
    async def scenario(store: Store) -> object:
        return notify.subscribe(store, 1)

    with open_store("sqlite://") as store:
        assert _run(lambda: scenario(store)) is None
        assert store.listener is None
