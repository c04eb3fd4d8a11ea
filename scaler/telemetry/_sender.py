"""The sender: a run's records posted to the service in numbered batches, for a store URL
``http://`` or ``https://`` (the service owns the store; the job holds a writer's token).

Runs on the reporting rank's writer thread, in place of ``_writer``: it takes the queue's
commands in their order, as the writer does, and posts each take as one batch with the
run's next number; it retries that very batch until the service answers, so a batch whose
answer was lost is known by its number and stored once. Each answer carries the run's
pending control requests, handed to the training thread (``Handout``); while no records
come, an empty batch every ``poll_s`` asks for them and keeps the run's heartbeat.
Training never waits for the network: records wait in the queue, past its bound dropped
and counted, as for a store.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import socket
import threading
import time
from typing import Any

import httpx

from ..store.states import RunStatus
from ._batches import items, steps_in
from ._control_poller import Handout
from ._queue import Command, CommandQueue
from ._writer import RunSpec

__all__ = ["TOKEN_ENV", "ServiceRefused", "ServiceSender", "is_service_url"]

log = logging.getLogger("scalewatch.telemetry")

TOKEN_ENV = "SCALEWATCH_TOKEN"
CONNECT_S = 2.0
ANSWER_S = 30.0
# Answers worth another try: the service restarting, overloaded, or its store away.
RETRIED = frozenset({408, 429, 500, 502, 503, 504})


def is_service_url(url: object) -> bool:
    """Whether a store URL names the service rather than a database.

    >>> is_service_url("https://sw.example:8000"), is_service_url("sqlite:///sw.db")
    (True, False)
    """
    return isinstance(url, str) and url.lower().startswith(("http://", "https://"))


class ServiceRefused(Exception):
    """The service refused a body for good (a 4xx other than a wait): what it said."""


class ServiceSender:
    """Posts ``queue`` to the service at ``url`` on a daemon thread, as ``run``."""

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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        token = os.environ.get(TOKEN_ENV, "")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            base_url=url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(ANSWER_S, connect=CONNECT_S),
            transport=transport,
        )
        self._url = url
        self._run = run
        self._queue = queue
        self._handout = handout
        self._coalesce_s = coalesce_s
        self._retry_s = retry_s
        self._poll_s = poll_s
        self._sequence = 0  # the run's last batch the service stored
        self._posted_at = 0.0
        self.run_id: int | None = None
        self.failing: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="scalewatch-sender", daemon=True)

    def _loop(self) -> None:
        queue = self._queue
        while True:
            queue.wait_for_work(self._poll_s, self._coalesce_s)
            stopping = self.stop.is_set()
            try:
                if self.run_id is None:
                    self._open()
                self._send_pending()
                if time.monotonic() - self._posted_at >= self._poll_s and not stopping:
                    self._post({"sequence": self._sequence, "items": []})  # a poll
                self._recovered()
            except ServiceRefused as refused:  # the run itself refused: nothing to retry
                self._failed(str(refused))
                if not stopping:
                    self.stop.wait(self._retry_s)
            except (httpx.HTTPError, _Stopped) as error:
                self._failed(_one_line(error))
                if not stopping:
                    self.stop.wait(self._retry_s)
            queue.pass_done()
            if stopping:
                return

    def _open(self) -> None:
        run = self._run
        first = self._queue.first_wall_time()
        body = {
            "uid": run.uid,
            "name": run.name,
            "world_size": run.world_size,
            "config": dict(run.config),
            "control": dict(run.control),
            "started_at": run.started_at if first is None else min(run.started_at, first),
            "resume": run.resume,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "torch_version": _torch_version(),
        }
        answer = self._request("api/ingest/runs", body)
        self._sequence = int(answer["sequence"])
        self.run_id = int(answer["id"])

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
        """Post ``commands`` as the run's next batch until the service answers; refused for
        good, they are dropped and counted."""
        reason = self.failing or "telemetry queue full"
        body = {"sequence": self._sequence + 1, "items": items(commands, reason=reason)}
        while True:
            try:
                self._post(body)
                return
            except ServiceRefused as refused:
                dropped = steps_in(commands)
                self._queue.count_dropped(dropped)
                log.warning("scalewatch: the service refused %d records: %s", dropped, refused)
                return
            except httpx.HTTPError as error:
                self._failed(_one_line(error))
                if self.stop.wait(self._retry_s):
                    raise _Stopped("stopped while the service was away") from error

    def _post(self, body: dict[str, Any]) -> None:
        assert self.run_id is not None
        answer = self._request(f"api/ingest/runs/{self.run_id}/batches", body)
        self._sequence = max(self._sequence, int(answer["sequence"]))
        self._posted_at = time.monotonic()
        self._handout((request["id"], request["values"]) for request in answer["control"])

    def _request(self, path: str, body: dict[str, Any]) -> Any:
        """The answer's JSON; raises :class:`httpx.HTTPError` for no answer or one worth
        another try, :class:`ServiceRefused` for a refusal."""
        response = self._client.post(
            path, content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        if response.status_code in RETRIED:
            raise httpx.HTTPStatusError(
                f"the service answered {response.status_code}: {_detail(response)}",
                request=response.request,
                response=response,
            )
        if response.is_error:
            raise ServiceRefused(f"{response.status_code} {_detail(response)}")
        return response.json()

    def end(self, status: RunStatus | None) -> None:
        """Tell the service the run ended ``status`` (after the thread stopped), one try;
        None: nothing (its heartbeat stops)."""
        if self.run_id is None or status is None:
            return
        try:
            self._post({"sequence": self._sequence + 1, "items": [], "end": str(status)})
        except (httpx.HTTPError, ServiceRefused) as error:
            log.warning("scalewatch: could not mark run %s %s: %s", self.run_id, status, error)

    def close_store(self) -> None:
        self._client.close()

    def _failed(self, reason: str) -> None:
        if self.failing is None:
            log.warning(
                "scalewatch: the service at %s is not taking records (%s);"
                " records wait, then are dropped",
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


class _Stopped(Exception):
    pass


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = detail if isinstance(detail, str) else response.reason_phrase
    return text.splitlines()[0] if text else "no reason given"


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
