"""The service on a thread of the test's own process (a real uvicorn on 127.0.0.1, what a
browser or ``httpx`` talks to), and the events of its live streams as a client reads them.

    with serve_on_thread(db_url, poll_s=0.05) as url:
        with httpx.stream("GET", f"{url}/api/runs/1/stream") as response:
            first = next(events(response))
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import uvicorn
from pydantic import SecretStr

from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings


@dataclass
class Event:
    event: str
    data: str
    id: str | None


def events(response: httpx.Response, *, opened: bool = False) -> Iterator[Event]:
    """The events of a stream's response. With ``opened``, the stream's opening comment is
    read first, here: from then on the server sends every control change."""
    lines = response.iter_lines()
    if opened:
        while not next(lines).startswith(": streaming run"):
            pass
    return _parsed(lines)


def _parsed(lines: Iterator[str]) -> Iterator[Event]:
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if "event" in fields:
                yield Event(fields["event"], fields.get("data", ""), fields.get("id"))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


@contextlib.contextmanager
def serve_on_thread(db_url: str, poll_s: float, **stream: float) -> Iterator[str]:
    """A real uvicorn serving the app over ``db_url`` on a free port of 127.0.0.1, in a
    thread; its URL. Its socket is bound before the server starts: no other can take the port."""
    settings = Settings(db=db_url, token=SecretStr("t"), stream_poll_s=poll_s, **stream)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(settings), log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(timeout=10)
    sock.close()
    assert not thread.is_alive(), "the server kept a stream open after its client left"
