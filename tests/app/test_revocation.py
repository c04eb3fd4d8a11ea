"""Revocation takes effect at once everywhere, on a real uvicorn: the open streams of a
revoked or expired identity end (within 2 s, with a last event that says why), its
tickets stop working, and a token revoked on the store by another process is refused
without waiting out the cache of checked tokens."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from scalewatch.store.engine import Store, open_store
from scalewatch.store.identities import Role, create_identity, revoke_identity
from scalewatch.store.runs import heartbeat
from tests._helpers.service import add_run, simulate
from tests._helpers.serving import Event, events, serve_on_thread
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.slow


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _last_event_within(stream: Iterator[Event], seconds: float) -> tuple[Event, float]:
    """Read ``stream`` to its end on a thread; its last event and when the stream ended."""
    seen: list[Event] = []
    ended = threading.Event()

    def read() -> None:
        for event in stream:
            seen.append(event)
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    assert ended.wait(seconds), "the stream went on"
    return seen[-1], time.monotonic()


def _live_run(store: Store) -> int:
    run = add_run(store, simulate(5, set()))
    heartbeat(store, run)
    return run


def test_a_stream_ends_when_its_token_is_revoked_through_the_service(
    db_url: str, store: Store
) -> None:
    """A stream opened before DELETE /api/tokens/NAME kept sending until its client left."""
    run = _live_run(store)
    ada = create_identity(store, "ada", Role.VIEWER, by="test").token
    with (
        serve_on_thread(db_url, poll_s=0.05) as url,
        httpx.Client(base_url=url, timeout=10) as http,
        http.stream("GET", f"/api/runs/{run}/stream", headers=_bearer(ada)) as response,
    ):
        assert response.status_code == 200
        revoked = http.delete("/api/tokens/ada", headers=_bearer("t"))
        asked = time.monotonic()
        assert revoked.status_code == 200
        last, ended = _last_event_within(events(response), 5.0)
    assert ended - asked < 2.0
    assert last.event == "refused"
    assert json.loads(last.data) == {"detail": "'ada' was revoked"}


def test_a_stream_and_a_ticket_end_when_the_token_is_revoked_on_the_store(
    db_url: str, store: Store
) -> None:
    """`scalewatch tokens revoke` writes the store: the service learns it from the store's
    trail of identity events, not at the end of its 5 s cache of checked tokens."""
    run = _live_run(store)
    ada = create_identity(store, "ada", Role.VIEWER, by="test").token
    with (
        serve_on_thread(db_url, poll_s=0.05) as url,
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        assert http.get("/api/whoami", headers=_bearer(ada)).status_code == 200  # now cached
        ticket = http.post("/api/tickets", headers=_bearer(ada)).json()["ticket"]
        with http.stream("GET", f"/api/runs/{run}/stream", headers=_bearer(ada)) as response:
            other = open_store(db_url)  # another process's connection, as the CLI's
            try:
                revoke_identity(other, "ada", by="cli")
            finally:
                other.close()
            asked = time.monotonic()
            last, ended = _last_event_within(events(response), 5.0)
            assert ended - asked < 2.0 and last.event == "refused"
        refused = wait_for(
            lambda: http.get("/api/whoami", headers=_bearer(ada)).status_code == 401,
            timeout=2.0,
            what="the revoked token to be refused",
        )
        assert refused and time.monotonic() - asked < 2.5
        export = http.get(f"/api/runs/{run}/export", params={"ticket": ticket})
        assert export.status_code == 401
        assert export.json()["detail"] == "the stream ticket's identity 'ada' was revoked"
        # The bootstrap admin's ticket, and anonymous reads, are untouched.
        admin_ticket = http.post("/api/tickets", headers=_bearer("t")).json()["ticket"]
        assert http.get(f"/api/runs/{run}/export", params={"ticket": admin_ticket}).is_success


def test_a_stream_ends_when_its_token_expires(db_url: str, store: Store) -> None:
    run = _live_run(store)
    with (
        serve_on_thread(db_url, poll_s=0.05) as url,
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        # its life counted from a service already serving: a loaded machine may take
        # longer than the token's life to start one
        expires = time.time() + 1.5
        ada = create_identity(store, "ada", Role.VIEWER, by="test", expires_at=expires).token
        with http.stream("GET", f"/api/runs/{run}/stream", headers=_bearer(ada)) as response:
            assert response.status_code == 200
            last, _ = _last_event_within(events(response), 6.0)
            ended = time.time()
    assert last.event == "refused" and json.loads(last.data) == {"detail": "'ada' has expired"}
    assert expires <= ended < expires + 2.0
