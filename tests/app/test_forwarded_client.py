"""Who the client is, on a real ``scalewatch serve``: ``X-Forwarded-For`` counts from a
proxy of ``--trust-proxy`` only, and a same-host proxy listens on a unix socket.

Before, uvicorn trusted ``X-Forwarded-For`` from loopback: any local process could claim
the trusted proxy's address and be whoever the proxy's header named, admin included."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._helpers.net import free_port
from tests._helpers.processes import end_process
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.slow

TOKEN = "a-bootstrap-token-of-32-characters"
USER, ROLE = "X-Forwarded-Email", "X-Scalewatch-Role"
PROXY_FLAGS = ["--proxy-user-header", USER, "--proxy-role-header", ROLE]


@contextlib.contextmanager
def serving(tmp_path: Path, *flags: str, uds: Path | None = None) -> Iterator[httpx.Client]:
    """``scalewatch serve`` with ``flags``, on a free port of 0.0.0.0 (or on ``uds``); a
    client of it (over loopback, or the socket). Its output is in ``tmp_path/serve.log``."""
    where = ["--uds", str(uds)] if uds else ["--host", "0.0.0.0", "--port", str(free_port())]
    command = [sys.executable, "-m", "scalewatch.app", "serve", "--db",
               f"sqlite:///{tmp_path / 'sw.db'}", *where, *flags]  # fmt: skip
    env = {**os.environ, "SCALEWATCH_TOKEN": TOKEN}
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    transport = httpx.HTTPTransport(uds=str(uds)) if uds else None
    base = "http://scalewatch" if uds else f"http://127.0.0.1:{where[3]}"
    try:
        with httpx.Client(base_url=base, transport=transport, timeout=10) as http:

            def answers() -> bool:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()
                if uds and not _listening(uds):  # httpx leaks a unix socket it cannot connect
                    return False
                try:
                    return http.get("/healthz").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(answers, timeout=60, what="the service to answer")
            yield http
    finally:
        end_process(server)
        log.close()


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def test_a_local_process_cannot_claim_the_trusted_proxys_address(tmp_path: Path) -> None:
    """Finding 1: from loopback, 'X-Forwarded-For: 10.78.0.1' made the proxy's header
    believed: mallory was admin and made herself an admin token."""
    forged = {"X-Forwarded-For": "10.78.0.1", USER: "mallory", ROLE: "admin"}
    with serving(tmp_path, "--trust-proxy", "10.78.0.1/32", *PROXY_FLAGS) as http:
        assert http.get("/api/whoami", headers=forged).status_code == 401
        made = http.post("/api/tokens", headers=forged, json={"name": "m", "role": "admin"})
        assert made.status_code == 401
        me = http.get("/api/whoami", headers={**forged, "Authorization": f"Bearer {TOKEN}"})
        assert (me.status_code, me.json()["name"]) == (200, "admin")
        listed = http.get("/api/tokens", headers={"Authorization": f"Bearer {TOKEN}"})
    assert listed.json() == []  # nobody named by the header was made


def test_a_local_process_cannot_choose_its_address_to_escape_the_penalty(
    tmp_path: Path,
) -> None:
    """Finding 2: 30 wrong tokens, each with another X-Forwarded-For, never reached 429,
    and the access log named addresses that never connected."""
    with serving(tmp_path, "--trust-proxy", "10.78.0.1/32", *PROXY_FLAGS) as http:
        codes = [
            http.get(
                "/api/runs",
                headers={"Authorization": "Bearer wrong", "X-Forwarded-For": f"6.6.6.{i}"},
            ).status_code
            for i in range(30)
        ]
    assert codes[:20] == [401] * 20 and codes[-1] == 429, codes
    assert "6.6.6." not in (tmp_path / "serve.log").read_text()


def test_a_same_host_proxy_named_by_trust_proxy_names_its_users(tmp_path: Path) -> None:
    """Finding 2: a proxy on the same host that sends a standard X-Forwarded-For got 401:
    uvicorn made the forwarded address the client, which was then not the proxy. Its
    users' wrong tokens lock out only themselves."""
    with serving(tmp_path, "--trust-proxy", "127.0.0.1/32", *PROXY_FLAGS) as http:
        proxied = {"X-Forwarded-For": "203.0.113.9", USER: "ada@example.org"}
        me = http.get("/api/whoami", headers=proxied)
        assert (me.status_code, me.json()["name"]) == (200, "proxy:ada@example.org")
        assert http.get("/api/whoami", headers={USER: "jürgen".encode()}).json()["name"] == (
            "proxy:jürgen"
        )
        latin1 = http.get("/api/whoami", headers={USER: b"j\xfcrgen"})
        assert latin1.status_code == 400 and "not UTF-8" in latin1.json()["detail"]
        guesser = {"Authorization": "Bearer wrong", "X-Forwarded-For": "6.6.6.6, 198.51.100.1"}
        codes = [http.get("/api/runs", headers=guesser).status_code for _ in range(22)]
        assert codes[-1] == 429
        # Another client behind the same proxy, and its left-most hop a lie: not locked.
        other = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": "198.51.100.1, 192.0.2.4"}
        assert http.get("/api/runs", headers=other).status_code == 200


def test_a_same_host_proxy_on_a_unix_socket(tmp_path: Path) -> None:
    """serve --uds: a socket of mode 0660, whose peers are the proxy."""
    sock = tmp_path / "scalewatch.sock"
    with serving(tmp_path, *PROXY_FLAGS, uds=sock) as http:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        me = http.get("/api/whoami", headers={USER: "ada", "X-Forwarded-For": "192.0.2.4"})
        assert me.json()["name"] == "proxy:ada"
        assert (
            http.get("/api/whoami", headers={USER: "ada", ROLE: "operator"}).json()["role"]
            == "operator"
        )
    assert not sock.exists()  # removed as the service stops
