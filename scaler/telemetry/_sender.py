"""The sender: a run's records posted to the service in numbered batches, for a store URL
``http://`` or ``https://`` (the service owns the store; the job holds a writer's token).

Runs on the reporting rank's writer thread, in place of ``_writer``: it takes the queue's
commands in their order, as the writer does, and posts each take as the run's next batch.
Each answer carries the run's pending control requests, handed to the training thread
(``Handout``); while no records come, an empty batch every ``poll_s`` asks for them and
keeps the run's heartbeat. Training never waits for the network.

While the service cannot be reached, batches go to the node's spool (``scalewatch.spool``), synced
at each batch, and are posted from it in their order once the service answers: a batch
whose answer was lost keeps its number, so the service stores it once. Past the spool's
bound, a batch's steps are dropped (the oldest kept) and a gap recorded in their place.
When the service first answers, the runs that jobs of this node left spooled for it are
sent too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

import httpx

from ..spool.client import ServiceClient, ServiceRefused, one_line, torch_version
from ..spool.folder import Spool, send_orphans, send_spool, unsent_bytes
from ..store.states import RunStatus
from ._batches import items, steps_in
from ._control_poller import Handout
from ._queue import Command, CommandQueue, is_step
from ._writer import RunSpec

__all__ = ["ServiceSender"]

log = logging.getLogger("scalewatch.telemetry")


class ServiceSender:
    """Posts ``queue`` to the service at ``url`` on a daemon thread, as ``run``; spools
    under ``spool_root`` up to ``spool_bytes`` while the service is away."""

    store = None  # no store of its own: the service's
    owns_store = False
    file_id = None

    def __init__(
        self,
        url: str,
        run: RunSpec,
        queue: CommandQueue,
        handout: Handout,
        *,
        coalesce_s: float,
        retry_s: float,
        poll_s: float,
        spool: Spool,
        spool_bytes: int,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._client = ServiceClient(url, transport=transport)
        self._url = url
        self._run = run
        self._queue = queue
        self._handout = handout
        self._coalesce_s = coalesce_s
        self._retry_s = retry_s
        self._poll_s = poll_s
        self._spool = spool
        self._spool_bytes = spool_bytes
        self._spooling = False  # run.json is written for this outage
        self._numbered = 0  # the run's last batch numbered (posted or spooled)
        self._posted_at = 0.0
        self._tried_at = 0.0
        self._orphans_sent = False
        self.run_id: int | None = None
        self.failing: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="scalewatch-sender", daemon=True)

    def _loop(self) -> None:
        queue = self._queue
        if not self._spool.claim():  # another process writes this run: a folder of its own
            self._spool = Spool(self._spool.root, f"{self._run.uid}-{os.getpid()}")
            self._spool.claim()
        self._numbered = self._spool.last_sequence
        while True:
            queue.wait_for_work(self._poll_s, self._coalesce_s)
            stopping = self.stop.is_set()
            try:
                self._pass(stopping)
            except ServiceRefused as refused:  # the run itself refused: nothing to retry
                self._failed(str(refused), away=False)
                if not stopping:
                    self.stop.wait(self._retry_s)
            except (httpx.HTTPError, OSError) as error:
                self._failed(one_line(error))
                if not stopping:
                    self.stop.wait(self._retry_s)
            queue.pass_done()
            if stopping:
                return

    def _pass(self, stopping: bool) -> None:
        due = self.failing is None or time.monotonic() - self._tried_at >= self._retry_s
        if due and (self.run_id is None or self._spool.pending() or self.failing is not None):
            self._tried_at = time.monotonic()
            try:
                self._reach()
            except httpx.HTTPError as error:  # away: this pass's batches spool
                self._failed(one_line(error))
        self._send_pending()
        polled = time.monotonic() - self._posted_at < self._poll_s
        if self.failing is None and self.run_id is not None and not (stopping or polled):
            self._post({"sequence": self._numbered, "items": []})  # a poll
        if self.failing is None and not self._orphans_sent:
            self._orphans_sent = True
            for uid, what in send_orphans(self._spool.root, self._url):
                log.warning("scalewatch: spooled run %s sent: %s", uid, what)

    def _reach(self) -> None:
        """Open the run if need be, then post what the spool holds; the service answers."""
        if self.run_id is None:
            self.run_id, stored = self._client.open_run(self._opening())
            self._numbered = max(self._numbered, stored)
        if self._spool.pending():
            send_spool(self._spool, self._client, on_answer=self._answered)
        elif self.failing is not None:  # a poll failed, say: does it answer now?
            self._post({"sequence": self._numbered, "items": []})
        self._recovered()

    def _opening(self) -> dict[str, Any]:
        run = self._run
        first = self._queue.first_wall_time()
        return {
            "uid": run.uid,
            "name": run.name,
            "world_size": run.world_size,
            "config": dict(run.config),
            "control": dict(run.control),
            "started_at": run.started_at if first is None else min(run.started_at, first),
            "resume": run.resume,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "torch_version": torch_version(),
        }

    def _send_pending(self) -> None:
        queue = self._queue
        while commands := queue.take():
            try:
                self._send(commands)
            except BaseException:
                queue.put_back(commands)
                raise
            finally:
                queue.written()

    def _send(self, commands: list[Command]) -> None:
        """Post ``commands`` as the run's next batch, or spool it; refused for good, its
        steps are dropped and counted."""
        if self.run_id is None and self._run.resume:
            raise _Unnumbered("the run to resume is not opened yet")  # its number unknown
        reason = self.failing or "telemetry queue full"
        self._numbered += 1
        if self.failing is None and not self._spool.pending() and self.run_id is not None:
            try:
                self._post_commands(self._numbered, commands, reason)
                return
            except ServiceRefused as refused:
                dropped = steps_in(commands)
                self._queue.count_dropped(dropped)
                log.warning("scalewatch: the service refused %d records: %s", dropped, refused)
                return
            except httpx.HTTPError as error:
                self._failed(one_line(error))
        # Spooled as objects: whichever service sends them on takes those.
        body = {"sequence": self._numbered, "items": items(commands, reason=reason)}
        self._spool_batch(body, commands)

    def _post_commands(self, sequence: int, commands: list[Command], reason: str) -> None:
        """Post ``commands`` as the batch ``sequence``: steps as rows where the service
        takes them (of the columns it names: a field newer than the service is left out).
        Rows refused (a service restarted with other columns) are posted again as objects,
        under the same number, and no rows are sent after."""
        columns = self._client.row_columns
        if columns is not None and is_step(commands[0]):
            rows = {"sequence": sequence, "items": items(commands, reason=reason, rows=columns)}
            try:
                self._post(rows)
                return
            except ServiceRefused as refused:
                self._client.row_columns = None
                log.warning("scalewatch: the service refused steps as rows (%s); sent as objects",
                            refused)  # fmt: skip
        self._post({"sequence": sequence, "items": items(commands, reason=reason)})

    def _spool_batch(self, body: dict[str, Any], commands: list[Command]) -> None:
        spool = self._spool
        if not self._spooling:
            self._spooling = True
            spool.write_run(self._url, self._opening())
        room = self._spool_bytes - unsent_bytes(spool.root)
        if _size_of(body) > room:  # the oldest steps that fit are kept, the rest dropped
            body, dropped = _fitted(body, room)
            self._queue.count_dropped(dropped)
        spool.append(body)

    def _post(self, body: dict[str, Any]) -> None:
        assert self.run_id is not None
        self._answered(self._client.post_batch(self.run_id, body))
        self._posted_at = time.monotonic()

    def _answered(self, answer: dict[str, Any]) -> None:
        self._handout((request["id"], request["values"]) for request in answer["control"])

    def end(self, status: RunStatus | None) -> None:
        """Tell the service the run ended ``status`` (after the thread stopped), one try;
        spooled behind the run's other batches while any wait. None: nothing."""
        if status is None:
            return
        self._numbered += 1
        body = {"sequence": self._numbered, "items": [], "end": str(status)}
        try:
            if self.failing is None and self.run_id is not None and not self._spool.pending():
                self._post(body)
                return
            self._spool_batch(body, [])
            self._reach()
        except (httpx.HTTPError, ServiceRefused, OSError) as error:
            log.debug("scalewatch: the run's end waits in the spool: %s", one_line(error))

    def close_store(self) -> None:
        self._client.close()
        if self._spool.pending():
            log.warning(
                "scalewatch: %d bytes of run %s wait in the spool %s: the next scalewatch"
                " process on this node sends them, or `scalewatch spool send`",
                self._spool.unsent(),
                self._run.uid,
                self._spool.folder,
            )
        self._spool.release()

    def _failed(self, reason: str, *, away: bool = True) -> None:
        """Said once a failure: the service away (its batches spool), or refusing the run."""
        if self.failing is None and away:
            log.warning(
                "scalewatch: the service at %s cannot be reached (%s); records spool to %s"
                " (at most %d bytes) until it answers",
                self._url,
                reason,
                self._spool.folder,
                self._spool_bytes,
            )
        elif self.failing is None:
            log.warning(
                "scalewatch: the service at %s refuses the run (%s); records wait, then are"
                " dropped",
                self._url,
                reason,
            )
        self.failing = reason

    def _recovered(self) -> None:
        if self.failing is not None:
            log.warning(
                "scalewatch: the service takes records again; %d records dropped",
                self._queue.dropped,
            )
            self.failing = None
        self._spooling = self._spool.pending()


class _Unnumbered(httpx.HTTPError):
    """A batch that cannot be numbered before the service answers (a resumed run)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def _size_of(body: dict[str, Any]) -> int:
    return len(json.dumps(body)) + 1


def _fitted(body: dict[str, Any], room: int) -> tuple[dict[str, Any], int]:
    """``body`` in ``room`` bytes: its oldest steps that fit kept, the others dropped, the
    gaps they leave recorded in their place; and how many were dropped."""
    budget = room - _size_of({**body, "items": [i for i in body["items"] if i["kind"] != "steps"]})
    out: list[dict[str, Any]] = []
    dropped = 0
    for item in body["items"]:
        if item["kind"] != "steps":
            out.append(item)
            continue
        found: dict[int, list[dict[str, Any]]] = {}
        for finding in item["findings"]:
            found.setdefault(finding["step"], []).append(finding)
        kept: list[dict[str, Any]] = []
        for step in item["steps"]:
            size = len(json.dumps(step)) + len(json.dumps(found.get(step["step"], []))) + 2
            if size > budget:
                break
            budget -= size
            kept.append(step)
        left = item["steps"][len(kept) :]
        if kept:
            findings = [f for step in kept for f in found.get(step["step"], [])]
            out.append({**item, "steps": kept, "findings": findings})
        out.extend(_gaps(sorted(step["step"] for step in left)))
        dropped += len(left)
    return {**body, "items": out}, dropped


def _gaps(numbers: list[int]) -> list[dict[str, Any]]:
    """The gaps that the dropped steps ``numbers`` (in order) leave."""
    gaps: list[dict[str, Any]] = []
    for number in numbers:
        if gaps and gaps[-1]["last"] + 1 == number:
            gaps[-1]["last"] = number
            gaps[-1]["dropped"] += 1
        else:
            gap = {"kind": "gap", "first": number, "last": number, "dropped": 1}
            gaps.append({**gap, "reason": "the spool is full"})
    return gaps
