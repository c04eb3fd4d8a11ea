"""The HTTP/1.1 protocol ``serve`` speaks: uvicorn's h11 one, with a deadline on each
request's headers. In the server's event loop.

uvicorn times out a connection that stays idle between two requests (``timeout_keep_alive``),
but not one that trickles a request's headers a byte at a time: each byte restarts nothing,
and hundreds of such connections hold the service's sockets for as long as their clients
like. Here a request's headers must all have arrived ``header_timeout_s`` after the
connection opened, or after the answer to the one before; else the connection is closed.
A request's body is bounded in the app (:mod:`scalewatch.app.middleware.limits`).

And one peer address holds ``max_connections`` connections at most: a further one is
closed as it opens, before a byte is read, so a crowd of slow connections from one host
cannot hold the service's sockets however it paces them. A trusted proxy (``exempt``),
which carries many users' connections, and a unix socket's peers are not counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .middleware.forwarded import Networks, networks, trusted

__all__ = ["HeaderDeadline", "with_header_deadline"]


class HeaderDeadline(H11Protocol):
    """uvicorn's :class:`H11Protocol`; a connection whose next request's headers have not
    all arrived ``header_timeout_s`` after it became ready for them is closed."""

    header_timeout_s: float  # with_header_deadline's (the settings')
    max_connections: int
    exempt: Networks
    open_by_peer: Counter[str]  # the server's event loop's alone: no lock

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._peer: str | None = None  # counted against the cap

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if address is not None and not trusted(address, self.exempt):
            if self.open_by_peer[address] >= self.max_connections:
                transport.abort()  # unread, unanswered: the cap is the peer's own doing
                return
            self.open_by_peer[address] += 1
            self._peer = address
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is not None:
            self.open_by_peer[self._peer] -= 1
            if not self.open_by_peer[self._peer]:
                del self.open_by_peer[self._peer]
            self._peer = None
        elif self.transport is None:  # closed as it opened: nothing was made
            return
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


def with_header_deadline(
    header_timeout_s: float, max_connections: int = 256, exempt: Iterable[str] = ()
) -> type[HeaderDeadline]:
    """:class:`HeaderDeadline` with a deadline of ``header_timeout_s`` and a cap of
    ``max_connections`` a peer (those in the CIDRs ``exempt`` uncounted), for uvicorn's
    ``Config(http=...)``, which makes one of it per connection."""
    limits = {
        "header_timeout_s": header_timeout_s,
        "max_connections": max_connections,
        "exempt": networks(exempt),
        "open_by_peer": Counter(),
    }
    return type("HeaderDeadline", (HeaderDeadline,), limits)
