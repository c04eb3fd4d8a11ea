"""``scalewatch serve``: the service and the dashboard."""

from __future__ import annotations

import contextlib
import signal
import sys

import click

from ._common import Failed, Refused, command, db_option, settings

__all__ = ["serve"]


@command(
    "serve",
    help="Run the service and the dashboard. Control requests need the bearer token from"
    " $SCALEWATCH_TOKEN; without it a new token is generated, printed once and written to"
    " ~/.scalewatch/token-PORT (mode 0600; $SCALEWATCH_TOKEN_FILE to move it). Binding an"
    " address other than loopback requires a $SCALEWATCH_TOKEN of 16 characters or more.",
)
@db_option
@click.option("--host", help="address to bind (default 127.0.0.1)")
@click.option("--port", type=int, help="port (default 8765)")
@click.option(
    "--uds",
    metavar="PATH",
    help="listen on a unix socket (made 0660) instead of --host and --port: for a proxy on"
    " the same host, whose group alone may connect (with --proxy-user-header, its peers are"
    " the trusted proxy)",
)
@click.option(
    "--alerts",
    metavar="FILE",
    help="alert rules, webhooks and autopilots, a TOML file (default: $SCALEWATCH_ALERTS,"
    " else the default rules and no webhooks)",
)
@click.option(
    "--public-read",
    is_flag=True,
    default=None,
    help="bound beyond loopback, let anyone read (runs, steps, streams, exports) without a"
    " token; writes still need one",
)
@click.option(
    "--private-read",
    is_flag=True,
    default=None,
    help="reads need a viewer token on loopback too: a host shared with other users, who"
    " reach its loopback",
)
@click.option(
    "--trust-proxy",
    metavar="CIDRS",
    help="addresses of an authenticating proxy, comma-separated CIDRs (10.0.0.5/32), whose"
    " --proxy-user-header names the user",
)
@click.option("--proxy-user-header", metavar="NAME", help="e.g. X-Forwarded-User")
@click.option(
    "--proxy-role-header",
    metavar="NAME",
    help="the trusted proxy's header naming the role (default: a new user is a viewer)",
)
@click.option(
    "--log-reads",
    is_flag=True,
    help="log every request; by default reads answered below 400 (a dashboard's polls) are"
    " left out, and writes and errors logged",
)
@click.option("--ssl-certfile", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
@click.option("--ssl-keyfile", metavar="FILE", help="the certificate's private key (PEM)")
def serve(
    db: str | None,
    host: str | None,
    port: int | None,
    uds: str | None,
    alerts: str | None,
    log_reads: bool,
    **access: str | bool | None,
) -> None:
    from ..alerts.config import RulesFileError, load_rules
    from ..main import create_app
    from ._serving import BindRefused, CannotServe, access_line, make_server, ready_to_serve

    chosen = settings(host=host, port=port, uds=uds, alerts=alerts, **access)
    if chosen.uds is not None and (host is not None or port is not None):
        raise Refused("--uds listens instead of --host and --port: give one or the other")
    if (chosen.ssl_certfile is None) != (chosen.ssl_keyfile is None):
        raise Refused("--ssl-certfile and --ssl-keyfile go together")
    if chosen.public_read and chosen.private_read:
        raise Refused("--public-read and --private-read say opposite things: choose one")
    if chosen.trust_proxy and not chosen.proxy_user_header:
        raise Refused("--trust-proxy needs --proxy-user-header")
    if chosen.proxy_user_header and not (chosen.trust_proxy or chosen.uds):
        raise Refused("--proxy-user-header needs --trust-proxy (or --uds): whose header to trust")
    try:
        rules = load_rules(chosen.alerts) if chosen.alerts is not None else None
    except RulesFileError as refused:  # before anything else: nothing bound, no token
        raise Failed(f"alert rules: {refused}", 2) from None
    try:
        served, sock = ready_to_serve(chosen, out=sys.stdout)
    except BindRefused as refused:
        raise Refused(str(refused)) from None
    except CannotServe as refused:
        raise Failed(str(refused), refused.code) from None
    with sock:
        server = make_server(create_app(served, rules), served, sock, log_reads=log_reads)
        scheme = "https" if served.ssl_certfile else "http"
        if served.uds is not None:
            url = f"{scheme}+unix:{served.uds}"
        else:
            bound, bound_port = sock.getsockname()[:2]
            url = f"{scheme}://{f'[{bound}]' if ':' in bound else bound}:{bound_port}/"
        click.echo(f"scalewatch: {access_line(served)}")
        click.echo(f"scalewatch: serving {url} (Ctrl-C to stop)")
        if served.uds is not None:  # uvicorn hands SIGTERM back once stopped: remove the socket
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            with contextlib.suppress(KeyboardInterrupt):  # uvicorn hands Ctrl-C back once stopped
                server.run(sockets=[sock])
        finally:
            if served.uds is not None:
                served.uds.unlink(missing_ok=True)
    if not server.started:
        click.get_current_context().exit(3)
