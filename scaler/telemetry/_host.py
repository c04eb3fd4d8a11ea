"""The telemetry writer process: writes the runs of one training process to their stores.

Runs in a process of its own, started by the training process at its first run with
telemetry (``_remote``) and ending with it: the store's writes, its SQLAlchemy and the
control polls take no share of the training process's GIL. One ``Telemetry`` per run,
as a reporting rank would run it in-process (writer and control poller threads); its
control inbox forwards what the poller finds to the training process.

The main thread reads the connection, in order: steps go to the run's queue as they
come, a flush or a close is waited for on a thread of its own, so that reading never
stops. When the connection ends without a run's close (the training process was
killed, or exited without closing), what was received is written and the run is marked
left running: its heartbeat stops, and it reads crashed at the heartbeat's timeout, as a
run whose process was killed with its writer thread does. Nothing that reached this
process is lost.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from .._control import ControlUpdate
from .._control.inbox import ControlInbox
from .._step_sample import StepSample, TrainingRow, record_of
from ..store.records import ScaleLoad
from ..store.states import RunStatus
from . import Telemetry
from ._queue import RecordGap
from ._wire import Close, Flush, Marker, OpenRun, RunState, dumps, loads

log = logging.getLogger("scalewatch.telemetry")

STATE_S = 0.1  # how often a run's changed state is told to the training process
ORPHAN_TIMEOUT_S = 30.0  # how long the runs of a training process gone are written for


class _ForwardingInbox(ControlInbox):
    """A run's control inbox here: what the control poller posts goes to the training
    process, whose scaler applies it."""

    __slots__ = ("_host", "_key")

    def __init__(self, host: Host, key: int) -> None:
        super().__init__()
        self._host = host
        self._key = key

    def post(self, update: ControlUpdate) -> None:
        self._host.reply(("control", self._key, update))


@dataclass
class _Hosted:
    telemetry: Telemetry
    told: RunState = field(default_factory=RunState)


def state_of(telemetry: Telemetry) -> RunState:
    return RunState(telemetry.run_id, telemetry.dropped, telemetry.failing)


class Host:
    """Serves one training process's connection until it ends."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._runs: dict[int, _Hosted] = {}
        self._waits: list[threading.Thread] = []
        self._told_at = 0.0

    def reply(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` to the training process; from any thread. Gone: let go."""
        data = dumps(message)
        with self._send_lock, contextlib.suppress(OSError):
            self._conn.send_bytes(data)

    def serve(self) -> None:
        conn = self._conn
        while True:
            try:
                if conn.poll(STATE_S):
                    self._handle(loads(conn.recv_bytes()))
            except (EOFError, OSError):
                break
            self._tell_states()
        self._training_ended()

    def _handle(self, message: tuple[Any, ...]) -> None:
        """A run's items in their order: the steps between two markers queued together."""
        _, key, items = message
        start = 0
        for i, item in enumerate(items):
            if type(item) is Marker:
                self._take(key, items[start:i])
                self._mark(key, item)
                start = i + 1
        self._take(key, items[start:] if start else items)

    def _take(self, key: int, items: list[Any]) -> None:
        hosted = self._runs.get(key)
        if items and hosted is not None:  # else a run that could not be opened: logged then
            _take(hosted.telemetry, items)

    def _mark(self, key: int, marker: Marker) -> None:
        if marker.kind == "open":
            self._open(key, marker.body)
            return
        hosted = self._runs.get(key)
        if hosted is None:
            return
        if marker.kind == "flush":
            self._wait(self._flush, hosted.telemetry, marker.body)
        elif marker.kind == "close":
            del self._runs[key]
            self._wait(self._close, hosted.telemetry, marker.body)

    def _open(self, key: int, run: OpenRun) -> None:
        try:
            telemetry = Telemetry(
                run.settings,
                name=run.name,
                world_size=run.world_size,
                config=run.config,
                control=run.control,
                inbox=_ForwardingInbox(self, key),
                uid=run.uid,
                fresh=not run.resume,
                started_at=run.started_at,
            )
        except Exception:
            log.exception("scalewatch: the telemetry writer could not open run %s", run.uid)
            return
        self._runs[key] = _Hosted(telemetry)

    def _wait(self, work: Any, telemetry: Telemetry, request: Flush | Close) -> None:
        thread = threading.Thread(target=work, args=(telemetry, request), name="scalewatch-wait")
        thread.start()
        self._waits = [*(t for t in self._waits if t.is_alive()), thread]

    def _flush(self, telemetry: Telemetry, request: Flush) -> None:
        ok = telemetry.flush(request.timeout)
        self.reply(("done", request.token, ok, state_of(telemetry)))

    def _close(self, telemetry: Telemetry, request: Close) -> None:
        telemetry.close(RunStatus(request.status), request.timeout)
        self.reply(("done", request.token, True, state_of(telemetry)))

    def _tell_states(self) -> None:
        now = time.monotonic()
        if now - self._told_at < STATE_S:
            return
        self._told_at = now
        for key, hosted in list(self._runs.items()):
            state = state_of(hosted.telemetry)
            if state != hosted.told:
                hosted.told = state
                self.reply(("state", key, state))

    def _training_ended(self) -> None:
        """The training process is gone: write what came; its open runs stay as they are."""
        closing = [
            threading.Thread(target=hosted.telemetry.close, args=(None, ORPHAN_TIMEOUT_S))
            for hosted in self._runs.values()
        ]
        for thread in closing:
            thread.start()
        for thread in [*closing, *self._waits]:
            thread.join()


_PARAM_NORMS = TrainingRow._fields.index("param_norms")


def _take(telemetry: Telemetry, items: list[Any]) -> None:
    """Queue ``items`` (rows, samples, loads, gaps) in their order: a run of plain rows
    (no parameter norms named) straight as their ``steps`` rows, the rest as samples."""
    rows: list[tuple[Any, ...]] = []
    samples: list[StepSample] = []
    for item in items:
        kind = type(item)
        if kind is tuple and not item[_PARAM_NORMS]:
            if samples:
                telemetry.submit(samples)
                samples = []
            rows.append(item)
            continue
        if rows:
            telemetry.submit_rows(rows)
            rows = []
        if kind is tuple:
            samples.append(StepSample(record_of(item)))
        elif kind is StepSample:
            samples.append(item)
        else:
            if samples:
                telemetry.submit(samples)
                samples = []
            if kind is ScaleLoad:
                telemetry.note_scale_load(item)
            elif kind is RecordGap:
                telemetry.note_gap(item)
    if rows:
        telemetry.submit_rows(rows)
    if samples:
        telemetry.submit(samples)


class _LogForwarder(logging.Handler):
    """Sends what this process logs to the training process, which logs it (``_remote``)."""

    def __init__(self, host: Host, level: int) -> None:
        super().__init__(level)
        self._host = host

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = dict(record.__dict__)
            # as logging.handlers.QueueHandler.prepare: the message made here, the
            # traceback as text, nothing that might not pickle
            fields["msg"] = self.format(record)
            fields["args"] = None
            fields["exc_info"] = None
            fields["exc_text"] = None
            fields["stack_info"] = None
            self._host.reply(("log", fields))
        except Exception:
            self.handleError(record)


def main(fd: int, level: int = logging.WARNING) -> None:
    """Serve the connection on file descriptor ``fd`` (the training process's socket);
    what is logged here at ``level`` or above is logged by the training process."""
    # Ctrl-C reaches the whole foreground process group: the training process decides
    # when its runs end, and this one writes until it is told or its connection ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with Connection(fd) as conn:
        host = Host(conn)
        root = logging.getLogger()
        root.handlers[:] = [_LogForwarder(host, level)]
        root.setLevel(level)
        host.serve()
    sys.exit(0)
