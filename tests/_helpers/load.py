"""The load test's processes: a paced writer, SSE clients and chart clients, each bounded in
time, each printing one JSON line of results (with the CPU seconds it used).

    python -m tests._helpers.load writer URL RUN FIRST_STEP RATE SECONDS  (RATE 0: unpaced)
    python -m tests._helpers.load sse BASE RUNS CLIENTS LAST_STEP SECONDS
    python -m tests._helpers.load charts BASE RUNS RATE SECONDS LAST_STEP TIMEOUT

and, for the test and ``bench/fleet.py`` that drive them, :func:`serving`: the service
itself, a real ``scalewatch serve``.

RUNS is a run id, or several separated by commas: client i streams the i-th run (round
robin), each chart request asks for one of them at random.

The SSE clients say "streams open" on stderr once every stream's answer has started, and
stay until every stream has seen LAST_STEP (or SECONDS have passed); a chart
request waits up to TIMEOUT seconds for its answer. Both are generous: on a slow or busy
machine the figures get worse, but nothing is lost or cut off.

The SSE clients measure; they must not cost the machine more than the service does. All of
them share one event loop, read the raw HTTP/1.1 response (chunked framing undone by hand)
and look at each delivery once with bytes methods: the number of ``event: step`` in it, the
first and last ``id:``, and the ``wall_time`` of its first (oldest) step. No event is
decoded as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

from scalewatch.store.engine import open_store
from scalewatch.store.records import StepRecord
from scalewatch.store.runs import write_steps
from tests._helpers.net import free_port
from tests._helpers.processes import end_process
from tests._helpers.records import step_record

READY_TIMEOUT_S = 60.0  # for every stream's answer to start
BATCH = 500  # records per write: a telemetry thread's batch at 10k records/s, 20 writes/s
_STEP = b"event: step\n"
_COALESCED = b"event: coalesced\n"
_WALL_TIME = b'"wall_time":'
REPO = Path(__file__).resolve().parents[2]


class ServiceDidNotStart(RuntimeError):
    """``scalewatch serve`` exited, or did not answer ``/healthz`` in time; the message
    ends with its log."""


# The clients' bearer token, when the service guards its reads (``serve --private-read``).
TOKEN_ENV = "SCALEWATCH_LOAD_TOKEN"


def _authorization() -> str:
    """The clients' ``Authorization`` header line (with its CRLF), or nothing."""
    token = os.environ.get(TOKEN_ENV)
    return f"Authorization: Bearer {token}\r\n" if token else ""


@contextlib.contextmanager
def serving(
    url: str,
    tmp: Path,
    *,
    token: str,
    start_timeout_s: float = 60.0,
    options: Sequence[str] = (),
) -> Iterator[tuple[str, int]]:
    """``scalewatch serve --db url`` on a free port of 127.0.0.1, its output in
    ``tmp/serve.log`` and its token file in ``tmp`` (more ``serve`` ``options`` if
    given): yields (base URL, pid) once ``/healthz`` answers 200, and terminates it at the
    end (killed if it takes over 15 s).

    Raises :class:`ServiceDidNotStart` if it exits or does not answer in
    ``start_timeout_s`` seconds.
    """
    port = free_port()
    env = {**os.environ, "SCALEWATCH_TOKEN": token, "SCALEWATCH_TOKEN_FILE": str(tmp / "token")}
    log_path = tmp / "serve.log"
    argv = [
        sys.executable,
        "-m",
        "scalewatch.app",
        "serve",
        "--db",
        url,
        "--port",
        str(port),
        *options,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    why = "exited" if process.returncode is not None else "did not answer"
                    raise ServiceDidNotStart(
                        f"the service did not start ({why}):\n{log_path.read_text()}"
                    )
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            yield base, process.pid
        finally:
            end_process(process, timeout=15)


def records(first: int, count: int, wall_time: float, spacing: float = 0.0) -> list[StepRecord]:
    """Steps ``first``.. of a run, the last at ``wall_time``, each ``spacing`` seconds after
    the one before (a batch's steps happened over the time it gathered)."""
    last = first + count - 1
    return [
        step_record(
            step,
            wall_time=wall_time - (last - step) * spacing,
            scale=65536.0,
            overflow=step % 1000 == 0,
            inf_ranks=(1,) if step % 1000 == 0 else (),
            scale_after=32768.0 if step % 1000 == 0 else 65536.0,
            growth_tracker=step % 2000,
        )
        for step in range(first, first + count)
    ]


def writer(url: str, run: int, first: int, rate: float, seconds: float) -> dict[str, Any]:
    """Write batches of ``BATCH`` records, one due every ``BATCH / rate`` s, for ``seconds``
    (``rate`` 0: back to back, as fast as the store takes them).

    ``rate`` in the result is what was achieved: records over the time from the first
    batch's start to the last one's end; ``busy`` is the time spent inside ``write_steps``.
    """
    store = open_store(url)
    cpu = time.process_time()
    start = time.monotonic()
    written, busy, step, late = 0, 0.0, first, 0.0
    batches = int(rate * seconds) // BATCH if rate else None
    i = 0
    while (i < batches) if batches is not None else (time.monotonic() - start < seconds):
        if rate:
            wait = start + i * BATCH / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                late = max(late, -wait)
        began = time.monotonic()
        write_steps(store, run, records(step, BATCH, time.time()))
        busy += time.monotonic() - began
        written += BATCH
        step += BATCH
        i += 1
    elapsed = time.monotonic() - start
    store.close()
    return {
        "written": written,
        "elapsed": elapsed,
        "busy": busy,
        "rate": written / elapsed,
        "capacity": written / busy,
        "max_late": late,
        "last_step": step - 1,
        "cpu_s": time.process_time() - cpu,
    }


class _Stream(asyncio.Protocol):
    """One SSE client on a raw connection: ``GET`` over HTTP/1.1, then counting."""

    def __init__(self, host: str, path: str, out: dict[str, Any], last_step: int) -> None:
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n"
            f"{_authorization()}\r\n"
        ).encode()
        self.out = out
        self.last_step = last_step
        self.lags: list[float] = out["lags"]
        self.head = b""  # the response head, until it is complete
        self.chunked: bool | None = None  # None: head not read yet
        self.raw = b""  # chunked framing not undone yet (a partial size line)
        self.left = 0  # data bytes left in the current HTTP chunk
        self.skip = 0  # bytes of the CRLF after a chunk still to skip
        self.tail = b""  # SSE text after the last complete event
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.out["errors"].append(repr(exc))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        try:
            if self.chunked is None:
                data = self._read_head(data)
                if self.chunked is None:
                    return
            self._events(self._unchunk(data) if self.chunked else data, now)
        except Exception as error:  # reported to the test
            self.out["errors"].append(repr(error))
            assert self.transport is not None
            self.transport.abort()

    def _read_head(self, data: bytes) -> bytes:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            return b""
        head, body = self.head[:end].decode("latin-1"), self.head[end + 4 :]
        status_line, *fields = head.split("\r\n")
        self.out["status"] = int(status_line.split()[1])
        headers = {
            name.strip().lower(): value.strip().lower()
            for name, _, value in (field.partition(":") for field in fields)
        }
        self.chunked = headers.get("transfer-encoding") == "chunked"
        return body

    def _unchunk(self, data: bytes) -> bytes:
        if not self.raw and not self.skip and self.left > len(data):
            self.left -= len(data)  # all of it inside the current HTTP chunk
            return data
        raw = self.raw + data if self.raw else data
        pieces: list[bytes] = []
        pos, end = 0, len(raw)
        while pos < end:
            if self.left:
                take = min(self.left, end - pos)
                pieces.append(raw[pos : pos + take])
                pos += take
                self.left -= take
                if not self.left:
                    self.skip = 2
            elif self.skip:
                take = min(self.skip, end - pos)
                pos += take
                self.skip -= take
            else:
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(raw[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if size == 0:
                    self.out["ended"] = True
                    pos = end
                    break
                self.left = size
        self.raw = raw[pos:]
        return b"".join(pieces)

    def _events(self, body: bytes, now: float) -> None:
        text = self.tail + body if self.tail else body
        cut = text.rfind(b"\n\n")
        if cut < 0:
            self.tail = text
            return
        # The complete events are text[:end]; searched in place, never copied.
        end, self.tail = cut + 2, text[cut + 2 :]
        done = text
        if done.find(_COALESCED, 0, end) >= 0:
            self._coalesced(done[:end], now)
            count = 0
        else:
            count = done.count(_STEP, 0, end)
        if count:
            out = self.out
            # Events start at 0 or after a blank line; only an event starts with "id: ".
            i = 0 if done.startswith(b"id: ") else done.find(b"\n\nid: ", 0, end) + 2
            first = int(done[i + 4 : done.find(b"\n", i)])
            j = done.rfind(b"\n\nid: ", 0, end) + 2
            j = j if j > i else i
            last = int(done[j + 4 : done.find(b"\n", j)])
            if out["last"] is not None and first != out["last"] + 1:
                out["gaps"] += 1
            if last - first + 1 != count:
                out["gaps"] += 1
            if out["first"] is None:
                out["first"] = first
            out["last"] = last
            out["events"] += count
            # The first step of a delivery is its oldest: its lag is the delivery's worst.
            k = done.find(_WALL_TIME, i) + len(_WALL_TIME)
            self.lags.append(now - float(done[k : done.find(b",", k)]))
        if done.find(b"event: end\n", 0, end) >= 0:
            self.out["ended"] = True
        if self.out["last"] is not None and self.out["last"] >= self.last_step:
            assert self.transport is not None
            self.transport.close()  # seen everything: leave, as a browser tab does

    def _coalesced(self, events: bytes, now: float) -> None:
        """A delivery with an ``event: coalesced`` (the service skipped steps while busy):
        event by event. The skipped steps count as covered, not as a gap; the first step
        after them gives the delivery's lag."""
        out, lagged = self.out, False
        for block in events.split(b"\n\n"):
            fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
            kind = fields.get(b"event")
            if kind == b"coalesced":
                gap = json.loads(fields[b"data"])
                first, last = gap["after"] + 1, gap["to"]
                out["coalesced"] += last - first + 1
            elif kind == b"step":
                first = last = int(fields[b"id"])
                out["events"] += 1
                if not lagged:
                    self.lags.append(now - json.loads(fields[b"data"])["wall_time"])
                    lagged = True
            else:
                continue
            if out["last"] is not None and first != out["last"] + 1:
                out["gaps"] += 1
            if out["first"] is None:
                out["first"] = first
            out["last"] = last


async def _sse(
    base: str, runs: list[int], clients: int, last_step: int, seconds: float
) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    where = urlsplit(base)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    results: list[dict[str, Any]] = [
        {"status": None, "lags": [], "events": 0, "gaps": 0, "first": None, "last": None}
        | {"coalesced": 0}
        | {"ended": False, "errors": [], "run": runs[i % len(runs)]}
        for i in range(clients)
    ]
    streams = [
        _Stream(f"{host}:{port}", f"/api/runs/{out['run']}/stream", out, last_step)
        for out in results
    ]
    for stream, out in zip(streams, results, strict=True):
        try:
            await loop.create_connection(lambda s=stream: s, host, port)  # type: ignore[misc]
        except OSError as error:
            out["errors"].append(repr(error))
            stream.closed.set_result(None)
    # Say on stderr once every stream has its answer's head (or failed): from then on each
    # sees every new step, so whoever writes may start.
    heads_by = loop.time() + READY_TIMEOUT_S
    waiting = list(zip(streams, results, strict=True))
    while loop.time() < heads_by and any(
        out["status"] is None and not s.closed.done() for s, out in waiting
    ):
        await asyncio.sleep(0.02)
    print("streams open", file=sys.stderr, flush=True)
    # A stream stays open while the run runs: close the clients still open at the deadline.
    await asyncio.wait([s.closed for s in streams], timeout=max(0.0, deadline - loop.time()))
    for stream, out in zip(streams, results, strict=True):
        if not stream.closed.done():
            out["open_at_deadline"] = True
            assert stream.transport is not None
            stream.transport.close()
    await asyncio.wait([s.closed for s in streams], timeout=5)
    return results


def sse(base: str, runs: list[int], clients: int, last_step: int, seconds: float) -> dict[str, Any]:
    cpu = time.process_time()
    streams = asyncio.run(_sse(base, runs, clients, last_step, seconds))
    return {"clients": streams, "cpu_s": time.process_time() - cpu}


async def _charts(
    base: str, runs: list[int], rate: float, seconds: float, last_step: int, timeout: float
) -> dict[str, Any]:
    """``rate`` chart requests a second, each on its own connection (``Connection: close``),
    sent on time whether or not earlier ones were answered: the client stays cheap however
    many are waiting (a pooled HTTP client's cost grows with its queue)."""
    rng = random.Random(0)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors: list[str] = []
    where = urlsplit(base)
    host, port = where.hostname or "127.0.0.1", where.port or 80

    async def one(run: int, params: dict[str, int]) -> None:
        began = time.monotonic()
        request = (
            f"GET /api/runs/{run}/steps?{urlencode(params)} HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nConnection: close\r\n{_authorization()}\r\n"
        ).encode()
        try:
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(request)
                response = await asyncio.wait_for(reader.read(), timeout)  # to the close
            finally:
                writer.close()
            latencies.append(time.monotonic() - began)
            head, _, body = response.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200 and not json.loads(body)["series"]["n"]:
                errors.append(f"no buckets for {params}")
        except Exception as error:
            errors.append(repr(error))

    start = time.monotonic()
    tasks = []
    for i in range(int(rate * seconds)):
        wait = start + i / rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        params = {"max_points": 2000}
        if i % 2:  # a zoomed window somewhere in the run
            width = rng.choice([500, 5_000, 50_000])
            params["start"] = rng.randrange(1, max(2, last_step - width))
            params["end"] = params["start"] + width
        run = runs[0] if len(runs) == 1 else rng.choice(runs)
        tasks.append(asyncio.create_task(one(run, params)))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout + 30)
    return {"latencies": latencies, "statuses": statuses, "errors": errors}


def charts(
    base: str, runs: list[int], rate: float, seconds: float, last_step: int, timeout: float
) -> dict[str, Any]:
    cpu = time.process_time()
    result = asyncio.run(_charts(base, runs, rate, seconds, last_step, timeout))
    return result | {"cpu_s": time.process_time() - cpu}


def _runs(arg: str) -> list[int]:
    return [int(run) for run in arg.split(",")]


def spawn(*args: object, stderr: int | None = None) -> subprocess.Popen[str]:
    """This module as a process (``writer``, ``sse`` or ``charts`` and their arguments)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests._helpers.load", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def wait_streams_open(clients: subprocess.Popen[str]) -> None:
    """Until every SSE client's stream has started: a stream starts at the run's last step
    when it opens, so one opened after the writer started would miss its first steps."""
    assert clients.stderr is not None
    lines = []
    for line in clients.stderr:
        if line.strip() == "streams open":
            return
        lines.append(line)
    raise AssertionError(f"the SSE clients ended before their streams opened: {lines[-5:]}")


def result(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """What a process of this module printed last, once it has ended well."""
    out, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, out
    parsed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return parsed


def main(argv: list[str]) -> int:
    kind, args = argv[0], argv[1:]
    if kind == "writer":
        result = writer(args[0], int(args[1]), int(args[2]), float(args[3]), float(args[4]))
    elif kind == "sse":
        result = sse(args[0], _runs(args[1]), int(args[2]), int(args[3]), float(args[4]))
    elif kind == "charts":
        result = charts(
            args[0], _runs(args[1]), float(args[2]), float(args[3]), int(args[4]), float(args[5])
        )
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
