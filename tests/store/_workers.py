"""Process targets for tests that need real concurrent processes (multiprocessing spawn)."""

from __future__ import annotations

from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier


def open_together(urls: list[str], barrier: Barrier, results: Queue[tuple[str, str]]) -> None:
    """For each url: wait for every process at the barrier, then open the store."""
    from scaler.store import open_store

    for url in urls:
        barrier.wait(timeout=120)
        try:
            with open_store(url) as store, store.read() as conn:
                conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one()
        except Exception as error:
            results.put((url, f"{type(error).__name__}: {error}"))
        else:
            results.put((url, "ok"))
