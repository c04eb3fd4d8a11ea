"""Getting ready to serve: the token, and the refusal to expose an unguarded service."""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, TextIO

import uvicorn
from pydantic import SecretStr

from scalewatch.store.engine import open_store
from scalewatch.store.permissions import exposure
from scalewatch.store.urls import parse_store_url, sqlite_file

from ..bootstrap_token import new_token, write_token_file
from ..http_protocol import with_header_deadline
from ..middleware.hosts import is_loopback
from ..settings import Settings

__all__ = [
    "MIN_TOKEN_CHARS",
    "SHUTDOWN_GRACE_S",
    "SWITCH_INTERVAL_S",
    "BindRefused",
    "CannotServe",
    "QuietReads",
    "access_line",
    "freeze_startup_heap",
    "listen",
    "listen_unix",
    "make_server",
    "prepare",
    "ready_to_serve",
    "refuse_unguarded",
    "tune_for_serving",
    "warn_if_exposed",
]

# The GIL switch interval of a serving process (CPython's default: 5 ms).
SWITCH_INTERVAL_S = 0.0005
# How long a stopping server waits for open responses before it cancels them.
SHUTDOWN_GRACE_S = 2
# The shortest token a service bound beyond loopback accepts (a generated one has 43).
MIN_TOKEN_CHARS = 16


def tune_for_serving() -> None:
    """Shorten the GIL switch interval of a process that serves the app.

    The event loop writes to every live stream many times a second while sync routes
    (chart queries) run in threads; with the default 5 ms each write that releases the
    GIL can cost the loop 5 ms before it gets it back, and a busy service falls seconds
    behind its streams.
    """
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


class CannotServe(RuntimeError):
    """Why serving cannot start (a port in use); ``code`` is the command's exit status."""

    code = 3


class BindRefused(CannotServe):
    """Binding a non-loopback address without an explicit token."""

    code = 2


def refuse_unguarded(settings: Settings) -> None:
    """Raise :class:`BindRefused` for a non-loopback host without an explicit token, or
    with one under ``MIN_TOKEN_CHARS`` characters."""
    if is_loopback(settings.host):
        return
    if settings.token is None:
        raise BindRefused(
            f"refusing to bind {settings.host!r} without an explicit token: anyone who can"
            " reach it could change running jobs. Set SCALEWATCH_TOKEN, or bind 127.0.0.1."
        )
    length = len(settings.token.get_secret_value())
    if length < MIN_TOKEN_CHARS:
        raise BindRefused(
            f"refusing to bind {settings.host!r} with a token of {length} characters: one"
            f" under {MIN_TOKEN_CHARS} can be guessed by anyone who can reach it. Set a longer"
            " SCALEWATCH_TOKEN (python -c 'import secrets; print(secrets.token_urlsafe(32))')."
        )


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host`` (a name, an address, ``[::1]``) and ``port``.

    ``serve`` binds before it writes a token: a port in use leaves the token file of the
    server that holds it as it is.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def listen_unix(path: Path) -> socket.socket:
    """A unix socket bound at ``path``, mode 0660 from its creation (the proxy's group may
    connect, no one else). A socket file left by a service that is gone is replaced; one
    that answers, or a file of another kind, is refused."""
    if path.is_socket():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens: a stale one
        else:
            raise CannotServe(f"cannot listen on {path}: a service is listening there")
        finally:
            probe.close()
    elif path.exists():
        raise CannotServe(f"cannot listen on {path}: it exists and is no socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)  # no window in which others may connect
    try:
        sock.bind(str(path))
        path.chmod(0o660)
    except OSError as error:
        sock.close()
        raise CannotServe(f"cannot listen on {path}: {error.strerror or error}") from error
    finally:
        os.umask(old)
    return sock


def ready_to_serve(settings: Settings, out: TextIO) -> tuple[Settings, socket.socket]:
    """What ``serve`` and ``demo`` do before serving, in an order that writes no token on a
    refusal: the bind check, the store (checked whole, then created or upgraded: a damaged
    or unusable one is a plain error here, not a traceback from the server), the socket,
    then the token (``prepare``).

    Raises :class:`CannotServe`; returns the settings with their token, and the socket.
    """
    refuse_unguarded(settings)
    open_store(settings.db, check=True).close()
    warn_if_exposed(settings.db)
    if settings.uds is not None:
        sock = listen_unix(settings.uds)
    else:
        try:
            sock = listen(settings.host, settings.port)
        except OSError as error:
            where = f"{settings.host}:{settings.port}"
            raise CannotServe(f"cannot listen on {where}: {error.strerror or error}") from error
    try:
        port = None if settings.uds is not None else sock.getsockname()[1]
        settings = prepare(settings, out, port=port)
        tune_for_serving()
    except BaseException:
        sock.close()
        raise
    return settings, sock


def warn_if_exposed(url: str) -> None:
    """One line on stderr when users other than its owner can read the SQLite store
    ``url``: no token the service asks for then keeps them from its runs."""
    path = sqlite_file(parse_store_url(url))
    line = exposure(path) if path is not None else None
    if line is not None:
        print(f"scalewatch: warning: {line}", file=sys.stderr, flush=True)


def freeze_startup_heap() -> None:
    """Put every object alive now (the imports, the app) beyond the cyclic collector.

    A serving process allocates fast (rows, events, responses), so the collector's full
    pass runs every few seconds; it walked every object of the imports each time, and
    under the fleet bench those passes (up to 274 ms each, 10 in 30 s) were the charts'
    p99. Frozen objects are never freed, which these, alive for the whole process, would
    not be anyway.
    """
    gc.collect()
    gc.freeze()


def access_line(settings: Settings) -> str:
    """Who may read, as ``serve`` says it at start.

    >>> access_line(Settings(host="0.0.0.0", public_read=True))
    'reads are public (--public-read); writes need an operator token'
    >>> access_line(Settings(private_read=True))
    'reads need a viewer token (--private-read); writes need an operator token'
    """
    if settings.public_read:
        reads = "reads are public (--public-read)"
    elif settings.private_read:
        reads = "reads need a viewer token (--private-read)"
    elif is_loopback(settings.host):
        reads = "reads are open on loopback"
    else:
        reads = "reads need a viewer token (bound beyond loopback)"
    proxy = ""
    sources = [*settings.trust_proxy, *(["the unix socket"] if settings.uds is not None else [])]
    if settings.proxy_user_header and sources:
        proxy = f"; {settings.proxy_user_header} names the user from {', '.join(sources)}"
    return f"{reads}; writes need an operator token{proxy}"


class QuietReads(logging.Filter):
    """Drops uvicorn's access line of a read that succeeded (a GET or HEAD answered below
    400): an open dashboard polls about once a second, which buried the writes and the
    errors under 65 lines a minute.

    >>> def line(method, status):
    ...     args = ("127.0.0.1:5", method, "/api/runs", "1.1", status)
    ...     return logging.LogRecord("uvicorn.access", 20, "", 0, '%s "%s %s" %d', args, None)
    >>> [QuietReads().filter(line(*r)) for r in (("GET", 200), ("GET", 404), ("POST", 202))]
    [False, True, True]
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        method, status = args[1], args[4]
        return not (method in ("GET", "HEAD") and isinstance(status, int) and status < 400)


def make_server(
    app: Any, settings: Settings, sock: socket.socket, *, log_reads: bool = False, **config: Any
) -> uvicorn.Server:
    """A server for ``app`` on ``sock``, which waits ``SHUTDOWN_GRACE_S`` at most for open
    responses. Live streams end as it stops: sse-starlette ends them on uvicorn's exit.
    A connection is closed when a request's headers take over ``settings.header_timeout_s``
    (:mod:`scalewatch.app.http_protocol`). Its access log leaves out the reads that
    succeeded unless ``log_reads`` (:class:`QuietReads`). The heap built so far is frozen
    (:func:`freeze_startup_heap`)."""
    freeze_startup_heap()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host.strip("[]"),
            port=settings.port if sock.family == socket.AF_UNIX else sock.getsockname()[1],
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            # uvicorn would take X-Forwarded-For from loopback as the client's address: any
            # local process could name one. ClientAddress reads it from --trust-proxy only.
            proxy_headers=False,
            http=with_header_deadline(
                settings.header_timeout_s,
                settings.max_connections_per_client,
                settings.trust_proxy,
            ),
            ssl_certfile=settings.ssl_certfile,
            ssl_keyfile=settings.ssl_keyfile,
            **config,
        )
    )
    access = logging.getLogger("uvicorn.access")  # configured by uvicorn.Config just now
    for quiet in [f for f in access.filters if isinstance(f, QuietReads)]:
        access.removeFilter(quiet)
    if not log_reads:
        access.addFilter(QuietReads())
    return server


def prepare(settings: Settings, out: TextIO, *, port: int | None = None) -> Settings:
    """Settings with a token: ``SCALEWATCH_TOKEN`` when set, else a new one, printed once on
    ``out`` and written (mode 0600) to ``settings.token_path(port)``: a file of the
    service's port alone, so a second service never replaces the token of a first.

    Raises :class:`BindRefused` for a non-loopback host without an explicit token.
    """
    refuse_unguarded(settings)
    if settings.token is not None:
        return settings
    token = new_token()
    path = write_token_file(settings.token_path(port), token)
    print(f"scalewatch: bearer token for control requests (also in {path}, mode 0600):", file=out)
    print(token, file=out, flush=True)
    return settings.model_copy(update={"token": SecretStr(token)})
