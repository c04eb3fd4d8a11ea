"""py-spy's samples of the service split by part, idle samples left out. A sample inside
a stream, a chart or a batch's storing is that one's wherever its leaf is (``OWNERS``);
any other goes to the part of its innermost frame that belongs to one (``PARTS``: a
pydantic frame called by FastAPI's request handler is validation; a socket write called
by h11 is the socket's).

>>> split_stacks("a (asyncio/events.py:1);b (h11/_connection.py:2) 3\\n"
...              "a (asyncio/events.py:1);c (pydantic/main.py:9) 1\\n")
[(0.75, 'HTTP: uvicorn, h11'), (0.25, 'validation: pydantic')]
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OWNERS", "PARTS", "sampled", "split_stacks"]

# (part, fragments of a frame's "function (file:line)"), tried on the whole stack, in order.
OWNERS: list[tuple[str, tuple[str, ...]]] = [
    ("SSE: streams (hubs, events, their sends)", ("scalewatch/app/live/", "sse_starlette")),
    ("charts: route and queries", ("chart_json",)),
    ("store: a batch's steps written", ("write_step_values",)),
    ("store: a batch's run state, pending requests", ("store_batch",)),
    (
        "background: alerts, autopilot, pollers",
        ("scalewatch/app/alerts", "scalewatch/app/autopilot", "CommitWatcher", "Revocations"),
    ),
]
# The same, tried on each frame, innermost first.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    (
        "store: other reads (sqlalchemy, driver)",
        ("sqlalchemy/", "sqlite3", "psycopg", "scalewatch/store/"),
    ),
    ("validation: pydantic", ("pydantic", "scalewatch/app/ingest/models.py")),
    ("JSON decode / encode", ("json/", "orjson", "msgspec")),
    (
        "FastAPI: dependencies, body, response",
        ("fastapi/dependencies", "fastapi/_compat", "fastapi/encoders", "serialize_response"),
    ),
    (
        "routing: FastAPI, Starlette",
        (
            "fastapi/",
            "starlette/routing",
            "starlette/requests",
            "starlette/responses",
            "starlette/datastructures",
        ),
    ),
    (
        "middleware",
        (
            "scalewatch/app/middleware",
            "starlette/middleware",
            "starlette/_exception_handler",
            "starlette/applications",
            "scalewatch/app/errors",
        ),
    ),
    ("HTTP: uvicorn, h11", ("uvicorn/", "h11/", "httptools", "scalewatch/app/http_protocol")),
    ("thread hops: anyio", ("anyio/",)),
    ("logging", ("logging/",)),
    ("event loop, sockets", ("asyncio/", "selectors", "socket.py")),
]
# A thread waiting, sampled anyway (py-spy --nonblocking cannot always tell).
IDLE = (
    "Condition.wait",
    "EpollSelector.select",
    "Event.wait",
    "_worker (concurrent",
    "Lock.acquire",
    "select (selectors",
)


def _part(stack: str, frames: list[str]) -> str:
    for part, fragments in OWNERS:
        if any(f in stack for f in fragments):
            return part
    for frame in reversed(frames):
        for part, fragments in PARTS:
            if any(f in frame for f in fragments):
                return part
    return "other"


def split_stacks(text: str) -> list[tuple[float, str]]:
    """(share, part) of collapsed stacks ``text`` (``frame;frame;... COUNT`` a line),
    largest first."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or any(frames[-1].startswith(idle) for idle in IDLE):
            continue
        counts[_part(stack, frames)] += int(count)
    total = sum(counts.values()) or 1
    return [(n / total, part) for part, n in counts.most_common()]


def py_spy() -> str:
    """py-spy's path, on PATH or beside the interpreter; exits with one line when neither
    has it (a bench checks before its minutes of load, not after)."""
    beside = Path(sys.executable).with_name("py-spy")
    spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if spy is None:
        sys.exit("--profile needs py-spy, on PATH or beside the interpreter: pip install py-spy")
    return spy


@contextlib.contextmanager
def sampled(pid: int, path: Path | None) -> Iterator[None]:
    """py-spy samples of ``pid`` written to ``path`` while the block runs (None: none)."""
    if path is None:
        yield
        return
    spy = py_spy()
    process = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(path),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        process.send_signal(2)
        process.wait(timeout=30)
