"""Slow clients against a real server on 127.0.0.1, over raw sockets: headers or a body
trickled a line or a byte at a time are cut off (scalewatch.app.http_protocol,
scalewatch.app.middleware.limits), and one client's requests in flight are capped
(scalewatch.app.middleware.clients)."""

from __future__ import annotations

import contextlib
import gc
import itertools
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from scalewatch.app.cli._serving import listen, make_server
from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.heavy  # a real server: make check leaves it out

TOKEN = "a-token-for-the-slow-clients"
DRIP_S = 0.1  # between two drips: a read's timeout, waiting for the server's answer
GIVE_UP_S = 10.0  # a connection still open this long after it began was never cut off


@contextlib.contextmanager
def served(tmp_path: Path, **limits: Any) -> Iterator[int]:
    """``serve``'s server (make_server) on a free port of 127.0.0.1, in a thread; its port."""
    settings = Settings(db=f"sqlite:///{tmp_path / 'sw.db'}", token=SecretStr(TOKEN), **limits)
    sock = listen("127.0.0.1", 0)
    server = make_server(create_app(settings), settings, sock, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), what="the server")
        assert server.started
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        gc.unfreeze()  # make_server froze this test process's heap


@dataclass
class Cut:
    answer: bytes  # what the server sent before it closed
    after_s: float  # seconds from before the connection was asked for


def trickle(port: int, head: bytes, drips: Iterable[bytes]) -> Cut:
    """Send ``head``, then the next of ``drips`` whenever the server has said nothing for
    ``DRIP_S`` (once they are spent, only wait), until it closes the connection."""
    drips = iter(drips)
    # The server's clock starts when it accepts the connection, which may come before
    # create_connection returns: the client's starts before it asks, or it reads short.
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=DRIP_S) as conn:
        conn.sendall(head)
        answer = b""
        while time.monotonic() - start < GIVE_UP_S:
            try:
                data = conn.recv(65536)
            except TimeoutError:
                drip = next(drips, None)
                if drip is not None:
                    with contextlib.suppress(OSError):  # closed under us: the next recv says
                        conn.sendall(drip)
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                return Cut(answer, time.monotonic() - start)
            answer += data
    raise AssertionError(f"still open after {GIVE_UP_S} s; answered {answer!r}")


def head_of(port: int, method: str, path: str, *lines: str) -> bytes:
    """A request's head, with its blank line when ``lines`` end with an empty one."""
    start = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    return (start + "".join(f"{line}\r\n" for line in lines)).encode()


def post_head(port: int, *, length: int, close: bool = False) -> bytes:
    """The whole head of a request that makes a token (as the bootstrap admin)."""
    lines = [f"Authorization: Bearer {TOKEN}", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}", *(["Connection: close"] if close else []), ""]
    return head_of(port, "POST", "/api/tokens", *lines)


def test_headers_trickled_a_line_at_a_time_are_cut_off(tmp_path: Path) -> None:
    with served(tmp_path, header_timeout_s=0.5) as port:
        cut = trickle(port, head_of(port, "GET", "/healthz"), itertools.repeat(b"X-Slow: 1\r\n"))
    assert cut.answer == b""
    assert 0.5 <= cut.after_s < GIVE_UP_S


def test_a_body_trickled_a_byte_at_a_time_is_answered_408(tmp_path: Path) -> None:
    with served(tmp_path, body_timeout_s=0.5) as port:
        head = post_head(port, length=1000)
        cut = trickle(port, head, itertools.repeat(b" "))
    assert cut.answer.startswith(b"HTTP/1.1 408 "), cut.answer
    assert b"request body not received within 0.5 s" in cut.answer
    assert 0.5 <= cut.after_s < GIVE_UP_S


def test_a_slow_body_is_not_cut_off_by_the_header_deadline(tmp_path: Path) -> None:
    """The header deadline is for headers: a body takes up to the body's own, and its
    answer comes whole."""
    body = b'{"name": "ada", "role": "viewer"}'
    chunks = [body[i : i + 4] for i in range(0, len(body), 4)]  # 9 drips: about 0.9 s
    with served(tmp_path, header_timeout_s=0.3, body_timeout_s=30) as port:
        cut = trickle(port, post_head(port, length=len(body), close=True), chunks)
    assert cut.answer.startswith(b"HTTP/1.1 201 "), cut.answer
    assert cut.after_s > 0.3


def test_one_client_may_have_so_many_requests_in_flight(tmp_path: Path) -> None:
    with served(tmp_path, max_requests_per_client=2, body_timeout_s=60) as port:
        base = f"http://127.0.0.1:{port}"
        head = post_head(port, length=10)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            for conn in held:
                conn.sendall(head)  # and no body: both wait in the service for it
            refused = wait_for(
                lambda: (r := httpx.get(f"{base}/healthz")).status_code == 429 and r,
                what="a third request refused",
            )
            assert refused.headers["retry-after"] == "1"
            assert "2 requests in flight" in refused.json()["detail"]
        finally:
            for conn in held:
                conn.close()
        wait_for(
            lambda: httpx.get(f"{base}/healthz").status_code == 200,
            what="the client's requests again, once its held ones left",
        )


def test_one_peer_may_hold_so_many_connections(tmp_path: Path) -> None:
    """250 trickling connections from one host were all held: now a peer's connections
    past the cap are closed as they open, unread; one closed frees its place."""
    with served(tmp_path, max_connections_per_client=4) as port, contextlib.ExitStack() as stack:
        held = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port))) for _ in range(4)
        ]
        for conn in held:
            conn.sendall(b"GET /healthz HTTP/1.1\r\n")  # headers begun, not ended
        with socket.create_connection(("127.0.0.1", port), timeout=GIVE_UP_S) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _read_to_close(extra) == b""  # closed, nothing answered
        held.pop().close()

        def answered() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=GIVE_UP_S) as again:
                again.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                return _read_to_close(again).startswith(b"HTTP/1.1 200")

        wait_for(answered, timeout=GIVE_UP_S, what="a place freed by a closed connection")


def _read_to_close(conn: socket.socket) -> bytes:
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while data := conn.recv(65536):
            answer += data
    return answer
