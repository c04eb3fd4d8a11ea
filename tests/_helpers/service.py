"""The service under test: its token, the loopback origin its test client speaks from, the
runs a test writes into its store (``simulate`` records of torch's rules, ``add_run``) and
the header of an authorised request.

    >>> auth("t")
    {'Authorization': 'Bearer t'}
"""

from __future__ import annotations

from typing import cast

from fastapi.testclient import TestClient
from starlette.applications import Starlette

from scalewatch.app.services import services_of
from scalewatch.store.engine import Store
from scalewatch.store.records import StepRecord
from scalewatch.store.runs import create_run, write_steps
from tests._helpers.records import step_record
from tests._helpers.waiting import wait_for

TOKEN = "s3cret-token-for-tests"
# The service bound to loopback answers only requests that name a loopback host.
LOCAL = "http://127.0.0.1"
CONTROL = {
    "growth_interval": 4,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "min_scale": None,
    "max_scale": None,
    "hysteresis": None,
}


def simulate(
    steps: int, overflows: set[int], *, first: int = 1, interval: int = 4, scale: float = 2.0**16
) -> list[StepRecord]:
    """Records of a scaler with torch's rules, overflowing (on rank 1) at ``overflows``."""
    records, tracker = [], 0
    for step in range(first, first + steps):
        overflow = step in overflows
        if overflow:
            after, tracker = scale * 0.5, 0
        elif tracker + 1 == interval:
            after, tracker = min(scale * 2.0, 2.0**24), 0
        else:
            after, tracker = scale, tracker + 1
        records.append(
            step_record(
                step,
                wall_time=1_700_000_000.0 + step / 4,
                scale=scale,
                overflow=overflow,
                inf_ranks=(1,) if overflow else (),
                scale_after=after,
                growth_tracker=tracker,
                growth_interval=interval,
            )
        )
        scale = after
    return records


def add_run(
    store: Store, records: list[StepRecord], *, name: str = "bert-large", batch: int = 50_000
) -> int:
    ref = create_run(
        store, name=name, world_size=2, config={"init_scale": 2.0**16}, control=CONTROL
    )
    for i in range(0, len(records), batch):
        write_steps(store, ref.id, records[i : i + batch])
    return ref.id


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# The service's own autopilot loop, in a test that ticks a loop of its own or changes an
# autopilot and reads it back: one tick at the start, then none for the test's length.
IDLE_AUTOPILOT_S = 3600.0


def after_first_autopilot_tick(client: TestClient) -> TestClient:
    """``client``, once its service's autopilot loop has made its first tick (made as the
    service starts, before the test writes a run): with ``autopilot_interval_s`` at
    ``IDLE_AUTOPILOT_S`` it makes no other, and the test's own writes are all there is."""
    autopilot = services_of(cast(Starlette, client.app)).autopilot
    wait_for(lambda: autopilot.ticks >= 1, timeout=60, what="the service's first autopilot tick")
    return client
