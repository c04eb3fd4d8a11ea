from __future__ import annotations

import time

from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from scalewatch.app.cli import cli
from scalewatch.app.middleware.identity import KNOWN_S
from scalewatch.store.engine import Store
from scalewatch.store.identities import identity_events_page
from tests._helpers.service import auth


def scalewatch(*argv: str) -> Result:
    return CliRunner().invoke(cli, list(argv), catch_exceptions=False)


def test_create_prints_the_token_once_and_it_works(
    client: TestClient, store: Store, db_url: str
) -> None:
    made = scalewatch("tokens", "create", "ada", "--role", "operator", "--db", db_url)
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert token.startswith("sw_") and "\n" not in token
    assert "ada (operator)" in made.stderr and token not in made.stderr
    assert client.get("/api/whoami", headers=auth(token)).json()["name"] == "ada"

    listed = scalewatch("tokens", "list", "--db", db_url)
    assert listed.exit_code == 0
    assert listed.stdout.splitlines()[0].split() == [
        "NAME", "ROLE", "KIND", "CREATED", "LAST", "USED", "EXPIRES", "REVOKED"
    ]  # fmt: skip
    assert listed.stdout.splitlines()[1].split()[:3] == ["ada", "operator", "token"]
    assert token not in listed.output and token.split("_", 2)[2] not in listed.output

    revoked = scalewatch("tokens", "revoke", "ada", "--db", db_url)
    assert revoked.exit_code == 0 and "ada revoked" in revoked.stdout
    # A running service knew the token: it refuses it once it reads the store again.
    deadline = time.monotonic() + KNOWN_S + 5
    while (answer := client.get("/api/whoami", headers=auth(token))).status_code == 200:
        assert time.monotonic() < deadline, "the revoked token is still accepted"
        time.sleep(0.05)
    assert answer.status_code == 401 and answer.json()["detail"] == "the bearer token was revoked"
    assert [e.action for e in identity_events_page(store)] == ["created", "revoked"]
    assert identity_events_page(store)[0].by.endswith("(cli)")


def test_expires_and_refusals(client: TestClient, store: Store, db_url: str) -> None:
    made = scalewatch(
        "tokens", "create", "tmp", "--role", "viewer", "--expires", "2w", "--db", db_url
    )
    assert made.exit_code == 0 and "until" in made.stderr
    assert scalewatch("tokens", "list", "--db", db_url).stdout.splitlines()[1].count("-") >= 2
    bad = scalewatch(
        "tokens", "create", "x", "--role", "viewer", "--expires", "soon", "--db", db_url
    )
    assert bad.exit_code == 2 and "--expires" in bad.stderr
    assert scalewatch("tokens", "create", "x", "--role", "root", "--db", db_url).exit_code == 2
    taken = scalewatch("tokens", "create", "tmp", "--role", "admin", "--db", db_url)
    assert taken.exit_code == 1 and "exists already" in taken.stderr
    missing = scalewatch("tokens", "revoke", "nobody", "--db", db_url)
    assert missing.exit_code == 1 and "no identity named 'nobody'" in missing.stderr
