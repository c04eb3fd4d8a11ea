from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, text

from scalewatch.store import Store
from scalewatch.store.identities import (
    IdentityExists,
    IdentityNotFound,
    Role,
    TokenRefusal,
    check_token,
    create_identity,
    identity_events_page,
    list_identities,
    proxy_identity,
    revoke_identity,
    touch_identity,
)
from scalewatch.store.schema import identities


def test_a_token_names_its_identity_until_revoked(store: Store) -> None:
    made = create_identity(store, "ada", Role.OPERATOR, by="root", now=100.0)
    found = check_token(store, made.token, now=101.0)
    assert not isinstance(found, TokenRefusal)
    assert (found.name, found.role, found.created_by) == ("ada", Role.OPERATOR, "root")

    revoke_identity(store, "ada", by="root", now=102.0)
    assert check_token(store, made.token, now=103.0) is TokenRefusal.REVOKED


def test_a_token_is_256_random_bits_and_never_the_same(store: Store) -> None:
    one = create_identity(store, "a", Role.VIEWER, by="root").token
    two = create_identity(store, "b", Role.VIEWER, by="root").token
    secret = one.rsplit("_", 1)[-1] if one.count("_") == 2 else one[20:]
    assert len(secret) >= 43  # token_urlsafe(32): 32 bytes, 256 bits
    assert one != two


def test_wrong_forged_or_foreign_tokens_name_nobody(store: Store) -> None:
    made = create_identity(store, "ada", Role.ADMIN, by="root")
    last = made.token[-1]
    forged = made.token[:-1] + ("A" if last != "A" else "B")
    for token in (
        forged,
        made.token + "x",
        "",
        "sw_",
        "Bearer " + made.token,
        "sw_" + "0" * 16 + "_x",
    ):
        assert check_token(store, token) is TokenRefusal.UNKNOWN, token


def test_an_expired_token_is_refused_as_expired(store: Store) -> None:
    made = create_identity(store, "tmp", Role.VIEWER, by="root", expires_at=200.0, now=100.0)
    assert not isinstance(check_token(store, made.token, now=199.0), TokenRefusal)
    assert check_token(store, made.token, now=200.0) is TokenRefusal.EXPIRED


def test_names_are_unique_until_revoked(store: Store) -> None:
    old = create_identity(store, "ada", Role.VIEWER, by="root")
    with pytest.raises(IdentityExists):
        create_identity(store, "ada", Role.ADMIN, by="root")
    revoke_identity(store, "ada", by="root")
    new = create_identity(store, "ada", Role.OPERATOR, by="root")
    assert check_token(store, old.token) is TokenRefusal.UNKNOWN  # the old secret is gone
    assert not isinstance(check_token(store, new.token), TokenRefusal)
    with pytest.raises(IdentityNotFound):
        revoke_identity(store, "nobody", by="root")
    with pytest.raises(ValueError):
        create_identity(store, "  ", Role.VIEWER, by="root")


def test_the_list_shows_no_secret_and_the_last_use(store: Store) -> None:
    made = create_identity(store, "ada", Role.VIEWER, by="root", now=5.0)
    touch_identity(store, made.identity.id, 7.5)
    [row] = list_identities(store)
    assert (row.name, row.role, row.created_at, row.last_used_at) == ("ada", Role.VIEWER, 5.0, 7.5)
    shown = repr(row)
    assert made.token not in shown
    assert made.token.split("_")[1] not in shown  # nor the public key


def test_creating_and_revoking_are_audited(store: Store) -> None:
    create_identity(store, "ada", Role.OPERATOR, by="root", now=1.0)
    revoke_identity(store, "ada", by="boss", now=2.0)
    revoke_identity(store, "ada", by="boss", now=3.0)  # no change, no event
    events = [(e.name, e.action, e.role, e.by, e.at) for e in identity_events_page(store)]
    assert events == [
        ("ada", "created", Role.OPERATOR, "root", 1.0),
        ("ada", "revoked", Role.OPERATOR, "boss", 2.0),
    ]


def test_a_proxy_user_is_a_viewer_of_its_own_namespace(store: Store) -> None:
    create_identity(store, "ada", Role.ADMIN, by="root")
    first = proxy_identity(store, "ada")
    assert not isinstance(first, TokenRefusal)
    assert (first.name, first.role, first.has_token) == ("proxy:ada", Role.VIEWER, False)
    assert proxy_identity(store, "ada") == first
    revoke_identity(store, "proxy:ada", by="root")
    assert proxy_identity(store, "ada") is TokenRefusal.REVOKED
    assert [(e.name, e.action) for e in identity_events_page(store)] == [
        ("ada", "created"),
        ("proxy:ada", "created"),
        ("proxy:ada", "revoked"),
    ]
    with pytest.raises(ValueError, match="is no user name"):
        proxy_identity(store, "ops/team lead")


def test_the_table_holds_no_token_in_clear(store: Store, db_url: str, backend: str) -> None:
    made = create_identity(store, "ada", Role.ADMIN, by="root")
    secret = made.token.split("_", 2)[2]
    with store.read() as conn:
        rows = conn.execute(select(identities)).all()
        dumped = repr(rows)
    assert made.token not in dumped and secret not in dumped
    if backend == "sqlite":
        store.close()
        path = Path(db_url.removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
        assert secret.encode() not in raw and made.token.encode() not in raw
        assert b"ada" in raw  # the file was read whole: the name is there
    else:
        with store.read() as conn:
            whole = conn.execute(text("SELECT CAST(identities AS text) FROM identities")).all()
        assert "ada" in repr(whole) and secret not in repr(whole)
