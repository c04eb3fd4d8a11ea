"""The HTTP/1.1 protocol ``serve`` speaks: uvicorn's h11 one, with a deadline on each
request's headers. In the server's event loop.

uvicorn times out a connection that stays idle between two requests (``timeout_keep_alive``),
but not one that trickles a request's headers a byte at a time: each byte restarts nothing,
and hundreds of such connections hold the service's sockets for as long as their clients
like. Here a request's headers must all have arrived ``header_timeout_s`` after the
connection opened, or after the answer to the one before; else the connection is closed.
A request's body is bounded in the app (:mod:`scalewatch.app.middleware.limits`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeaderDeadline", "with_header_deadline"]


class HeaderDeadline(H11Protocol):
    """uvicorn's :class:`H11Protocol`; a connection whose next request's headers have not
    all arrived ``header_timeout_s`` after it became ready for them is closed."""

    header_timeout_s: float  # with_header_deadline's (the settings')

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers, if the client sends one

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _expired(self) -> None:
        self._header_deadline = None
        in_flight = self.cycle is not None and not self.cycle.response_complete
        if not in_flight and not self.transport.is_closing():
            self.transport.close()  # no answer: a client this slow is not reading one


def with_header_deadline(header_timeout_s: float) -> type[HeaderDeadline]:
    """:class:`HeaderDeadline` with a deadline of ``header_timeout_s``, for uvicorn's
    ``Config(http=...)``, which makes one of it per connection."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout_s": header_timeout_s})
