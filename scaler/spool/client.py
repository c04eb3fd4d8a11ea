"""The service's ingest routes as a job calls them: a run opened, a batch posted.

Used by the sender (``_sender``) on the reporting rank's writer thread, and by whoever
sends a spool's batches (``folder``: the next sender on the node, ``scalewatch spool``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from typing import Any

import httpx

from ..store.step_rows import COLUMNS

__all__ = ["TOKEN_ENV", "ServiceClient", "ServiceRefused", "is_service_url", "one_line"]

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


class ServiceClient:
    """Posts to the service at ``url`` with ``$SCALEWATCH_TOKEN`` as a bearer token.

    Raises :class:`httpx.HTTPError` for no answer or one worth another try,
    :class:`ServiceRefused` for a refusal.
    """

    def __init__(self, url: str, *, transport: httpx.BaseTransport | None = None) -> None:
        token = os.environ.get(TOKEN_ENV, "")
        self.url = url
        # The columns of the step rows the service takes, when this job's steps have each
        # (it names them when the run is opened: an older service names none, and one
        # newer than the job may name a column the job's steps lack); else None.
        self.row_columns: tuple[str, ...] | None = None
        self._client = httpx.Client(
            base_url=url.rstrip("/") + "/",
            headers={"Authorization": f"Bearer {token}"} if token else {},
            timeout=httpx.Timeout(ANSWER_S, connect=CONNECT_S),
            transport=transport,
        )

    def open_run(self, body: dict[str, Any]) -> tuple[int, int]:
        """(the run's id, its last batch stored)."""
        answer = self._post("api/ingest/runs", body)
        named = tuple(answer.get("step_columns") or ())
        fits = "step" in named and len(set(named)) == len(named) and set(named) <= set(COLUMNS)
        self.row_columns = named if fits else None
        return int(answer["id"]), int(answer["sequence"])

    def post_batch(self, run_id: int, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self._post(f"api/ingest/runs/{run_id}/batches", body)
        return answer

    def _post(self, path: str, body: dict[str, Any]) -> Any:
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

    def close(self) -> None:
        self._client.close()


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = detail if isinstance(detail, str) else response.reason_phrase
    return text.splitlines()[0] if text else "no reason given"


def one_line(error: BaseException) -> str:
    """
    >>> one_line(OSError("no route\\nmore"))
    'OSError: no route'
    """
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
