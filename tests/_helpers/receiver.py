"""A webhook receiver on 127.0.0.1 for the tests: it records what it is sent, and can
answer errors first or hang."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)  # answered first, in turn; then 200
    hang: threading.Event | None = None  # set: answer; unset: hold every request
    bodies: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def receiver(statuses: list[int] | None = None, *, hang: bool = False) -> Iterator[Receiver]:
    """A receiver serving in a thread until the block ends (a hanging one is let go)."""
    state = Receiver("", list(statuses or []), threading.Event() if hang else None)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with state.lock:
                state.attempts += 1
                status = state.statuses.pop(0) if state.statuses else 200
            if state.hang is not None:
                state.hang.wait(30)
                return
            if status == 200:
                with state.lock:
                    state.bodies.append(json.loads(body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if state.hang is not None:
            state.hang.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
