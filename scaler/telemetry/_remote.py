"""A run's telemetry written by the training process's writer process (``_host``).

Runs in the training process, on the reporting rank. The training thread appends each
step to the run's list of items (a cpu step's row, from the training thread itself; a
cuda step's sample, from the recorder thread), and that is all it does for telemetry:
no lock, no wake-up. One sender thread per process takes every run's items each
``SEND_S`` (at once for a flush or a close) and sends them, pickled, to the writer
process; one receiver thread takes what comes back: the run's id and state, control
requests for the scaler's inbox, the answers to flushes and closes. Both threads wait on
the connection or a timer, not on the training thread, which never waits on either.

The writer process is started with the first run of a process (a fork gets its own) and
ends with the process: its connection's end is how it learns of it (``_host``).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from multiprocessing.connection import Connection
from typing import Any

from .._control.inbox import ControlInbox
from .._step_sample import StepSample
from ..mirrors import Mirror
from ..mirrors._feed import MirrorFeed
from ..store.records import ScaleLoad
from ..store.states import RunStatus
from ._queue import RecordGap
from ._wire import Close, Flush, Marker, OpenRun, RunState, dumps, loads

log = logging.getLogger("scalewatch.telemetry")

SEND_S = 0.1  # how long items gather before they are sent (a flush sends at once)
ANSWER_MARGIN_S = 10.0  # past a flush's or close's own timeout, for the answer to come
# The child imports the package from where this one was found if nothing else has it.
_CHILD = (
    "import sys; sys.path.append(sys.argv[2]);"
    " from scalewatch.telemetry._host import main; main(int(sys.argv[1]), int(sys.argv[3]))"
)
_KEYS = itertools.count(1)


@dataclass
class _Answer:
    event: threading.Event = field(default_factory=threading.Event)
    value: tuple[bool, RunState] | None = None  # None: the writer process is gone


class WriterLink:
    """The connection to this process's writer process, and its two threads."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-c",
                    _CHILD,
                    str(theirs.fileno()),
                    package_root,
                    # what it logs at or above this comes back (see _relog)
                    str(logging.getLogger("scalewatch").getEffectiveLevel()),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid = os.getpid()
        self._conn = Connection(ours.detach())
        self._runs: dict[int, RemoteTelemetry] = {}
        self._answers: dict[int, _Answer] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.alive = True
        self.sender = threading.Thread(
            target=self._send_loop, name="scalewatch-sender", daemon=True
        )
        self.receiver = threading.Thread(
            target=self._receive_loop, name="scalewatch-receiver", daemon=True
        )
        self.sender.start()
        self.receiver.start()

    # ------------------------------------------------ the training process's side

    def add(self, run: RemoteTelemetry) -> None:
        with self._lock:
            self._runs[run.key] = run
        self._wake.set()

    def remove(self, run: RemoteTelemetry) -> None:
        with self._lock:
            self._runs.pop(run.key, None)

    def expect(self) -> tuple[int, _Answer]:
        """A token to ask with, and where its answer will be."""
        answer = _Answer()
        with self._lock:
            token = next(self._tokens)
            if self.alive:
                self._answers[token] = answer
            else:
                answer.event.set()
        return token, answer

    def hurry(self) -> None:
        self._wake.set()

    # ------------------------------------------------ the sender thread

    def _send_loop(self) -> None:
        while self.alive:
            self._wake.wait(SEND_S)
            self._wake.clear()
            with self._lock:
                runs = list(self._runs.values())
            for run in runs:
                for message in run.messages():
                    if not self._send(message):
                        run.lost(message)

    def _send(self, message: tuple[Any, ...]) -> bool:
        if not self.alive:
            return False
        try:
            self._conn.send_bytes(dumps(message))
        except OSError:
            self._ended()
            return False
        return True

    # ------------------------------------------------ the receiver thread

    def _receive_loop(self) -> None:
        conn = self._conn
        while True:
            try:
                message = loads(conn.recv_bytes())  # our own writer process's
            except (EOFError, OSError):
                self._ended()
                return
            kind = message[0]
            if kind == "log":
                _relog(message[1])
                continue
            if kind == "done":
                _, token, ok, state = message
                with self._lock:
                    answer = self._answers.pop(token, None)
                if answer is not None:
                    answer.value = (ok, state)
                    answer.event.set()
                continue
            with self._lock:
                run = self._runs.get(message[1])
            if run is None:
                continue
            if kind == "state":
                run.state = message[2]
            elif kind == "control":
                run.inbox.post(message[2])

    def _ended(self) -> None:
        with self._lock:
            if not self.alive:
                return
            self.alive = False
            answers, self._answers = list(self._answers.values()), {}
            open_runs = bool(self._runs)
        self._wake.set()
        for answer in answers:
            answer.event.set()
        if open_runs:
            log.warning(
                "scalewatch: the telemetry writer process ended (%s); records of the runs"
                " open are dropped from now on",
                _exit_status(self.process),
            )

    def close(self) -> None:
        """End the connection: the writer process writes what it has, then exits."""
        self._conn.close()


def _relog(fields: dict[str, Any]) -> None:
    """A record the writer process logged, handled here by the logger of its name: the
    training script's logging configuration (levels, handlers, files) applies to it as to
    the training process's own records."""
    record = logging.makeLogRecord(fields)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)


def _exit_status(process: subprocess.Popen[bytes]) -> str:
    try:
        code = process.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return "its connection broke"
    return f"exit status {code}" if code >= 0 else f"killed by signal {-code}"


_LINK: WriterLink | None = None
_LINK_LOCK = threading.Lock()


def writer_link() -> WriterLink:
    """This process's writer process, started at the first call (and again in a fork,
    or after it ended)."""
    global _LINK
    with _LINK_LOCK:
        link = _LINK
        if link is None or link.pid != os.getpid() or not link.alive:
            link = _LINK = WriterLink()
        return link


class RemoteTelemetry:
    """A run's telemetry, as the training process sees it: what ``Telemetry`` offers a
    run's session (``RunTelemetry``), written by the writer process."""

    def __init__(
        self, link: WriterLink, run: OpenRun, inbox: ControlInbox, mirrors: Sequence[Mirror] = ()
    ) -> None:
        self.settings = run.settings
        self.uid = run.uid
        self.inbox = inbox
        self.key = next(_KEYS)
        self.state = RunState()
        self._link = link
        self._max_pending: int = run.settings.max_pending
        self._items: deque[Any] = deque([Marker("open", run)])
        self._lock = threading.Lock()  # between dropping the oldest and sending
        self._lost = 0  # records dropped in this process
        self._closed = False
        # the sender thread hands them what it takes (messages())
        self._mirrors = MirrorFeed(mirrors, self._run_ids) if mirrors else None
        link.add(self)

    def _run_ids(self) -> tuple[str, int | None]:
        return self.uid, self.state.run_id

    # ------------------------------------------------ the training thread's side

    def add_row(self, row: tuple[Any, ...]) -> None:
        """A cpu step's row (``TrainingRow``'s order); every step, from the training thread."""
        items = self._items
        items.append(row)
        if len(items) > self._max_pending:
            self._drop_oldest()

    def submit(self, samples: list[StepSample]) -> None:
        """Samples: a cuda step's (recorder thread), or a step with control changes or an
        explained overflow (training thread)."""
        self._items.extend(samples)
        if len(self._items) > self._max_pending:
            self._drop_oldest()

    def note_scale_load(self, load: ScaleLoad) -> None:
        self._items.append(load)

    @property
    def run_id(self) -> int | None:
        return self.state.run_id

    @property
    def dropped(self) -> int:
        return self._lost + self.state.dropped

    @property
    def failing(self) -> str | None:
        return self.state.failing

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def writer_pid(self) -> int:
        """The process that writes the run."""
        return self._link.process.pid

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        mirrors = () if self._mirrors is None else self._mirrors.threads
        return self._link.sender, self._link.receiver, *mirrors

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything handed over so far is in the store (or ``timeout``)."""
        answer = self._ask("flush", lambda token: Flush(token, timeout), timeout)
        return answer is not None and answer[0]

    def close(self, status: RunStatus = RunStatus.FINISHED, timeout: float = 30.0) -> None:
        """Write what is left, mark the run ``status``. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        _release(self.uid)
        answer = self._ask("close", lambda token: Close(token, str(status), timeout), timeout)
        self._link.remove(self)
        if answer is None:  # the writer process is gone, or did not answer
            with self._lock:
                unsent = _records(self._items)
                self._items.clear()
                self._lost += unsent
            if unsent:
                log.warning("scalewatch: %d telemetry records not written at close", unsent)
        if self._mirrors is not None:
            self._mirrors.close()

    def _ask(self, kind: str, request: Any, timeout: float) -> tuple[bool, RunState] | None:
        token, answer = self._link.expect()
        self._items.append(Marker(kind, request(token)))
        self._link.hurry()
        answer.event.wait(timeout + ANSWER_MARGIN_S)
        if answer.value is None:
            return None
        self.state = answer.value[1]
        return answer.value

    # ------------------------------------------------ the sender thread's side

    def messages(self) -> list[tuple[Any, ...]]:
        """What was handed over since the last call, in its order: one message, or none.

        Taken in one C call (``popleft`` until the count read first) and pickled in
        another, with no bytecode between items: a sender that ran Python per item would
        lose the GIL at each of the training thread's torch calls, and win it back, many
        times a send; the writer process splits the list (``_host``).
        """
        items = self._items
        with self._lock:
            taken = list(islice(iter(items.popleft, None), len(items)))
        if taken and self._mirrors is not None:
            self._mirrors.put(taken)
        return [("items", self.key, taken)] if taken else []

    def lost(self, message: tuple[Any, ...]) -> None:
        """``message`` (``messages()``'s) could not be sent: its records count as dropped."""
        self._lost += _records(message[2])

    def _drop_oldest(self) -> None:
        """Past ``max_pending`` items not yet sent (the writer process does not keep up):
        drop the oldest tenth of the steps, a gap in their place, which the writer process
        counts and records."""
        with self._lock:
            items = self._items
            count = max(1, self._max_pending // 10)
            ahead: list[Any] = []
            while count and items:
                item = items.popleft()
                step = _step_of(item)
                if step is None:
                    ahead.append(item)
                    continue
                last = ahead[-1] if ahead else None
                if type(last) is RecordGap and last.last + 1 == step:
                    ahead[-1] = RecordGap(last.first, step, last.dropped + 1)
                else:
                    ahead.append(RecordGap(step, step, 1))
                count -= 1  # counted by the writer process, with the gap
            items.extendleft(reversed(ahead))


def _step_of(item: Any) -> int | None:
    kind = type(item)
    if kind is tuple:
        step: int = item[0]
        return step
    if kind is StepSample:
        return int(item.record.step)
    return None


def _records(items: Any) -> int:
    """The records among ``items``, a gap's dropped ones too."""
    count = 0
    for item in items:
        if type(item) is RecordGap:
            count += item.dropped
        elif _step_of(item) is not None:
            count += 1
    return count


def _release(uid: str) -> None:
    from . import release_uid  # the package imports this module

    release_uid(uid)


def open_remote(
    run: OpenRun, inbox: ControlInbox, mirrors: Sequence[Mirror] = ()
) -> RemoteTelemetry:
    """``run``'s telemetry, written by this process's writer process (started if need be)."""
    return RemoteTelemetry(writer_link(), run, inbox, mirrors)


@atexit.register
def _at_exit() -> None:
    """Nothing is left to send once the runs are closed (their finalizers close them
    first): ending the connection tells the writer process to finish."""
    link = _LINK
    if link is not None and link.pid == os.getpid():
        with link._lock:
            busy = bool(link._runs)
        if not busy:
            link.close()
