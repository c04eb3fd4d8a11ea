"""Wrong tokens cost a client time: after a few, it is refused (429) whatever its token,
and the table that counts them stays small under a flood from many addresses."""

from __future__ import annotations

from fastapi.testclient import TestClient

from scalewatch.app.middleware.penalty import FailurePenalty
from scalewatch.store.engine import Store
from scalewatch.store.identities import Role, create_identity
from tests._helpers.service import TOKEN, add_run, auth, simulate


def test_repeated_wrong_tokens_lock_the_client_out(client: TestClient, store: Store) -> None:
    """300 wrong-token POSTs got 300 401s within a second: guessing was free."""
    run = add_run(store, simulate(10, set()))
    url = f"/api/runs/{run}/control"
    client.app.state.services.penalty = FailurePenalty(free_failures=3, base_s=30.0)
    codes = [client.post(url, json={"scale": 2.0}, headers=auth("x" * 20)).status_code
             for _ in range(6)]  # fmt: skip
    assert codes == [401, 401, 401, 401, 429, 429]
    locked = client.post(url, json={"scale": 2.0}, headers=auth(TOKEN))
    assert locked.status_code == 429  # a right token then tells nothing either
    assert 0 < int(locked.headers["retry-after"]) <= 30
    assert locked.json()["detail"].startswith("too many wrong tokens from testclient: try again")
    assert client.get(f"/api/runs/{run}/control").json()["history"] == []


def test_a_right_token_clears_nothing_but_goes_on_while_locked() -> None:
    """A success cleared every failure of its address, whatever credential succeeded: a
    valid viewer token every 15th request allowed unlimited guesses at SCALEWATCH_TOKEN."""
    penalty = FailurePenalty(free_failures=2, base_s=10.0)
    penalty.succeeded("a", b"mine")
    for now in (1.0, 2.0):
        assert penalty.failed("a", now=now) == 0.0
    penalty.succeeded("a", b"mine")
    assert penalty.failed("a", now=3.0) == 10.0  # the count went on
    assert penalty.locked_for("a", b"guess", now=4.0) == 9.0
    assert penalty.locked_for("a", None, now=4.0) == 9.0
    assert penalty.locked_for("a", b"mine", now=4.0) == 0.0  # its own token still works
    assert penalty.locked_for("b", b"mine", now=4.0) == 0.0  # nor is anyone else locked


def test_interleaved_right_tokens_do_not_reset_the_guesses(
    client: TestClient, store: Store
) -> None:
    viewer = create_identity(store, "vic", Role.VIEWER, by="test").token
    client.app.state.services.penalty = FailurePenalty(free_failures=5, base_s=30.0)
    codes = []
    for i in range(12):
        token = viewer if i % 3 == 0 else f"guess-{i:016d}"
        codes.append(client.get("/api/whoami", headers=auth(token)).status_code)
    # 5 guesses free, the 6th locks the client: the next are refused unread; the
    # viewer's own token goes on.
    assert codes == [200, 401, 401, 200, 401, 401, 200, 401, 401, 200, 429, 429]
    bootstrap = client.get("/api/whoami", headers=auth(TOKEN))
    assert bootstrap.status_code == 429  # a new credential tells nothing while locked


def test_the_lockout_doubles_up_to_a_bound_and_is_forgotten() -> None:
    penalty = FailurePenalty(free_failures=1, base_s=1.0, max_s=8.0, forget_s=100.0)
    locks = [penalty.failed("a", now=float(t)) for t in range(7)]
    assert locks == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert penalty.locked_for("a", now=10.0) == 4.0
    assert penalty.failed("a", now=300.0) == 0.0  # long after the last one: a new count


def test_a_flood_from_many_addresses_keeps_the_table_bounded() -> None:
    penalty = FailurePenalty(free_failures=0, base_s=60.0, max_clients=500)
    for i in range(100_000):
        penalty.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", now=1.0 + i * 1e-6)
    assert len(penalty) == 500
    assert penalty.locked_for("10.1.134.159", now=2.0) > 0  # the newest are kept
    assert penalty.locked_for("10.0.0.0", now=2.0) == 0.0  # the oldest went first


def test_wrong_tokens_on_any_guarded_route_count_alike(client: TestClient, store: Store) -> None:
    """Reads, streams' tickets and the identities' routes are guessing grounds too."""
    client.app.state.services.penalty = FailurePenalty(free_failures=3, base_s=30.0)
    wrong = auth("sw_" + "0" * 16 + "_" + "x" * 43)
    urls = ["/api/runs", "/api/tokens", "/api/whoami", "/api/runs/1/stream?ticket=forged"]
    codes = [client.get(url, headers=wrong if "ticket" not in url else {}).status_code
             for url in [*urls, "/api/tokens"]]  # fmt: skip
    assert codes == [401, 401, 401, 401, 429]
    assert client.get("/api/runs").status_code == 200  # an open read presents nothing
