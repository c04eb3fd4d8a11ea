"""Who the client is, decided once per request, before anything reads it.

uvicorn's own proxy handling is off (``make_server``): it trusts ``X-Forwarded-For`` from
loopback by default, which let any local process name any address, the trusted proxy's
included. Here the peer that connected is the client, unless it is a proxy of
``--trust-proxy`` (or the peer of a unix socket of ``serve --uds``, whose file mode says
who may connect): then the client is the rightmost address of its ``X-Forwarded-For`` that
is not itself a trusted proxy (the hops left of it are the client's own words).

``scope["client"]`` is rewritten to that address, so the penalty, the access log and the
limits all count the same client; ``scope["state"]["via_proxy"]`` says whether the request
came through a trusted proxy, which alone may name the user by its header.

>>> nets = networks(("10.0.0.1/32", "10.0.1.0/24"))
>>> forwarded_client("10.0.0.1", ["6.6.6.6, 192.0.2.7, 10.0.1.4"], nets)
'192.0.2.7'
>>> forwarded_client("192.0.2.9", ["6.6.6.6"], nets)
'192.0.2.9'
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["UNIX_PEER", "ClientAddress", "Networks", "forwarded_client", "networks", "trusted"]

Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
# The peer of a unix socket, which has no address.
UNIX_PEER = "unix"


def networks(cidrs: Iterable[str]) -> Networks:
    return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs)


def trusted(address: str, nets: Networks) -> bool:
    """Whether ``address`` is in one of ``nets`` (an address that is none: no).

    >>> trusted("::ffff:10.0.0.1", networks(["10.0.0.0/8"])), trusted("x", ())
    (True, False)
    """
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in nets)


def forwarded_client(peer: str, forwarded_for: list[str], nets: Networks) -> str:
    """The client of a request from ``peer`` carrying the ``X-Forwarded-For`` header lines
    ``forwarded_for``: the peer itself unless it is trusted; else the rightmost forwarded
    hop that is not a trusted proxy (all trusted: the leftmost; none: the peer)."""
    if peer != UNIX_PEER and not trusted(peer, nets):
        return peer
    hops = [hop.strip() for line in forwarded_for for hop in line.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not trusted(hop, nets):
            return hop[:64]  # the client's own words beyond a bound are no address
    return hops[0][:64] if hops else peer


class ClientAddress:
    """ASGI middleware: ``scope["client"]`` as :func:`forwarded_client` decides it."""

    def __init__(self, app: ASGIApp, trust_proxy: Iterable[str], unix_is_proxy: bool) -> None:
        self.app, self.nets, self.unix_is_proxy = app, networks(trust_proxy), unix_is_proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            peer = str(client[0]) if client and client[0] else UNIX_PEER
            via_proxy = trusted(peer, self.nets) or (peer == UNIX_PEER and self.unix_is_proxy)
            if via_proxy:
                lines = [
                    value.decode("latin-1")
                    for name, value in scope.get("headers", ())
                    if name == b"x-forwarded-for"
                ]
                address = forwarded_client(
                    UNIX_PEER if peer == UNIX_PEER else peer, lines, self.nets
                )
                scope["client"] = (address, 0)
            elif peer == UNIX_PEER:
                scope["client"] = (UNIX_PEER, 0)
            scope.setdefault("state", {})["via_proxy"] = via_proxy
        await self.app(scope, receive, send)
