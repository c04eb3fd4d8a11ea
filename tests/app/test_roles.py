"""Every operation of the OpenAPI document against every kind of caller: let through,
401 or 403, as the role the operation needs says. A route added without a role in
scalewatch.app.middleware.roles makes create_app refuse to start, and this matrix with it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.middleware.penalty import FailurePenalty
from scalewatch.app.middleware.roles import ROUTE_ROLES, undeclared
from scalewatch.app.settings import Settings
from scalewatch.store.engine import Store
from scalewatch.store.identities import Role, create_identity, proxy_identity, revoke_identity
from scalewatch.store.runs import end_run
from tests._helpers.service import LOCAL, TOKEN, add_run, auth, simulate

CALLERS = (
    "anonymous", "viewer", "operator", "admin", "writer", "revoked", "expired", "bootstrap"
)  # fmt: skip
# Behind a trusted proxy also: users its header names, with the role its role header says.
PROXY_CALLERS = ("proxy-viewer", "proxy-operator", "proxy-admin", "proxy-revoked")
PROXY, USER, ROLE = "10.1.0.9", "X-Forwarded-Email", "X-Scalewatch-Role"
THROUGH = "through"  # any answer of the route itself: 2xx, or its own 404, 409, 422


def tokens(store: Store) -> dict[str, str]:
    made = {
        role.value: create_identity(store, f"the-{role.value}", role, by="test").token
        for role in Role
    }
    made["revoked"] = create_identity(store, "gone", Role.ADMIN, by="test").token
    revoke_identity(store, "gone", by="test")
    past = time.time() - 1.0
    made["expired"] = create_identity(store, "old", Role.ADMIN, by="test", expires_at=past).token
    made["bootstrap"] = TOKEN
    return made


def expected(caller: str, need: Role | None, reads_open: bool) -> int | str:
    if need is None:
        return THROUGH
    if caller == "anonymous":
        return THROUGH if need is Role.VIEWER and reads_open else 401
    if caller in ("revoked", "expired", "proxy-revoked"):
        return 401
    role = Role.ADMIN if caller == "bootstrap" else Role(caller.removeprefix("proxy-"))
    return THROUGH if role.allows(need) else 403


def operations(document: dict[str, object]) -> Iterator[tuple[str, str]]:
    paths = document["paths"]
    assert isinstance(paths, dict)
    for path, methods in paths.items():
        for method in methods:
            yield method.upper(), path


def concrete(path: str, run: int) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: {"run": str(run), "step": "3"}.get(m[1], "nobody"), path)


def caller_headers(caller: str, made: dict[str, str]) -> dict[str, str]:
    if caller == "anonymous":
        return {}
    if caller.startswith("proxy-"):
        role = caller.removeprefix("proxy-")
        return {USER: f"p-{role}", ROLE: "admin" if role == "revoked" else role}
    return auth(made[caller])


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "behind-proxy"])
def test_every_operation_answers_every_caller_as_its_role_says(
    db_url: str, store: Store, tmp_path: Path, host: str
) -> None:
    proxy = host == "behind-proxy"
    settings = Settings(
        db=db_url,
        host="0.0.0.0" if proxy else host,
        token=SecretStr(TOKEN),
        token_file=tmp_path / "t",
        **(
            {"trust_proxy": f"{PROXY}/32", "proxy_user_header": USER, "proxy_role_header": ROLE}
            if proxy
            else {}
        ),
    )
    run = add_run(store, simulate(10, {3}))
    end_run(store, run)  # its stream ends by itself; writes to it are the route's 409
    made = tokens(store)
    callers = CALLERS + PROXY_CALLERS if proxy else CALLERS
    if proxy:
        proxy_identity(store, "p-revoked")
        revoke_identity(store, "proxy:p-revoked", by="test")
    reads_open = host == "127.0.0.1"
    seen = []
    client_address = (PROXY, 40000) if proxy else ("testclient", 50000)
    with TestClient(create_app(settings), base_url=LOCAL, client=client_address) as client:
        client.app.state.services.penalty = FailurePenalty(free_failures=10**6)  # type: ignore[attr-defined]
        document = client.get("/openapi.json").json()
        for method, path in operations(document):
            need = ROUTE_ROLES[method, path]
            for caller in callers:
                headers = caller_headers(caller, made)
                body = {} if method in ("POST", "PUT") else None
                answer = client.request(method, concrete(path, run), json=body, headers=headers)
                want = expected(caller, need, reads_open)
                got = answer.status_code if answer.status_code in (401, 403) else THROUGH
                assert got == want, (method, path, caller, answer.status_code, answer.text)
                if got != THROUGH:
                    detail = answer.json()["detail"]
                    assert "\n" not in detail and detail, detail
                    assert caller not in made or made[caller] not in answer.text
                    which = {"anonymous": "required", "revoked": "revoked", "expired": "expired",
                             "proxy-revoked": "revoked"}  # fmt: skip
                    assert which.get(caller, "needs" if got == 403 else "") in detail
                seen.append((method, path, caller))
    assert len(seen) == len(ROUTE_ROLES) * len(callers)


def test_no_write_is_open_to_a_viewer_and_identities_are_an_admins() -> None:
    for (method, path), need in ROUTE_ROLES.items():
        if method != "GET" and path != "/api/tickets":
            assert need in (Role.OPERATOR, Role.ADMIN, Role.WRITER), (method, path)
        if path.startswith("/api/tokens"):
            assert need is Role.ADMIN, (method, path)
        # A job's token records and reads its pending requests through the ingest routes alone.
        assert (need is Role.WRITER) == path.startswith("/api/ingest/"), (method, path)


def test_a_route_without_a_role_is_named(db_url: str) -> None:
    app = create_app(Settings(db=db_url))
    assert undeclared(app.openapi()) == []

    @app.get("/api/extra")
    def extra() -> dict[str, str]:
        return {}

    app.openapi_schema = None
    assert undeclared(app.openapi()) == ["GET /api/extra"]
