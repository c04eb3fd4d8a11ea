"""Service settings, from the environment (``SCALEWATCH_*``) or the command line."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from scalewatch.store.urls import default_url, store_url

__all__ = ["TOKEN_DIR", "Settings", "get_settings"]

# Where generated tokens are written, one file per port: two services never share one.
TOKEN_DIR = Path("~/.scalewatch")


class Settings(BaseSettings):
    """``SCALEWATCH_DB``, ``SCALEWATCH_TOKEN``, ``SCALEWATCH_HOST``, ``SCALEWATCH_PORT``..."""

    model_config = SettingsConfigDict(env_prefix="SCALEWATCH_", extra="ignore")

    db: str = Field(default_factory=default_url)
    token: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    token_file: Path | None = None  # None: TOKEN_DIR / "token-<port>"
    # Host names beside loopback that a service bound to loopback answers to (a reverse
    # proxy's name); "*" for any. NoDecode: the environment gives them comma-separated,
    # not as the JSON list pydantic-settings reads for a list by default.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    # Reads need a viewer's token beyond loopback, unless this says they are public; and
    # on loopback too when private_read says so (a host whose other users reach loopback).
    public_read: bool = False
    private_read: bool = False
    # Addresses (CIDR) of an authenticating proxy, whose header proxy_user_header names
    # the user (and proxy_role_header, when set, the role); from elsewhere both are ignored.
    trust_proxy: Annotated[tuple[str, ...], NoDecode] = ()
    # A unix socket to listen on instead of host:port (``serve --uds``), made 0660: for a
    # proxy on the same host, whose group alone may connect; its peers are the proxy.
    uds: Path | None = None
    proxy_user_header: str | None = None
    proxy_role_header: str | None = None
    # TLS served by uvicorn itself (else: none, or at the proxy).
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    # Seconds between two polls of the store by a live stream where nothing tells it of
    # new steps (an in-memory store), and between keep-alives.
    stream_poll_s: float = Field(default=0.05, gt=0)
    stream_keepalive_s: float = Field(default=15.0, gt=0)
    # Seconds between two polls of a stream that the store tells of new steps (PostgreSQL's
    # NOTIFY; a SQLite file's one poller of every streamed run, scalewatch.store.notify): for
    # the run's end and control changes, which are not announced.
    stream_listen_fallback_s: float = Field(default=1.0, gt=0)
    # Step events a run's hub keeps for streams a little behind (a slow client, a resume);
    # streams further behind read aligned pages of stream_behind_page steps, each read and
    # encoded once for all of them, the stream_behind_pages most recently used kept.
    stream_buffered_steps: int = Field(default=50_000, gt=0)
    stream_behind_page: int = Field(default=5000, gt=0)
    stream_behind_pages: int = Field(default=8, gt=0)
    # Seconds a live stream may fall behind the steps it has been sent: one further behind
    # (a busy machine, a slow client) skips to the newest steps with an ``event: coalesced``
    # that names the steps it left out (the store keeps them; the chart reads them back).
    stream_max_lag_s: float = Field(default=2.0, gt=0)
    # Seconds a chart request waits for a free query slot before it is answered 503 with
    # Retry-After (the dashboard then asks for coarser buckets): a busy service answers
    # fast rather than queueing requests for tens of seconds.
    chart_wait_s: float = Field(default=1.0, gt=0)
    # Seconds between two evaluations of the runs whose autopilot is on.
    autopilot_interval_s: float = Field(default=2.0, gt=0)
    # The alert rules file (``serve --alerts``); None: the default rules, no webhooks.
    alerts: Path | None = None
    # Seconds between two rounds of the alert rules over the store.
    alerts_interval_s: float = Field(default=1.0, gt=0, le=3600)
    # Slow clients: seconds a request's headers may take to arrive (after the connection
    # opened, or the answer before), and then its body; the requests one client address
    # may have in flight at once (an open live stream is one), beyond which it gets 429.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    max_requests_per_client: int = Field(default=128, gt=0)
    # Connections one peer address may hold open (a trusted proxy's are not counted).
    max_connections_per_client: int = Field(default=256, gt=0)

    @field_validator("db")
    @classmethod
    def _path_is_a_sqlite_file(cls, db: str) -> str:
        return store_url(db)

    @field_validator("allowed_hosts", "trust_proxy", mode="before")
    @classmethod
    def _comma_separated(cls, names: object) -> object:
        """``"proxy.example, *"`` -> ``("proxy.example", "*")``; ``""`` -> ``()``."""
        if isinstance(names, str):
            return tuple(name.strip() for name in names.split(",") if name.strip())
        return names

    @field_validator("trust_proxy")
    @classmethod
    def _networks(cls, cidrs: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in cidrs:
            ipaddress.ip_network(cidr, strict=False)  # ValueError: not a network
        return cidrs

    @field_validator("token")
    @classmethod
    def _empty_is_unset(cls, token: SecretStr | None) -> SecretStr | None:
        # An empty SCALEWATCH_TOKEN must not become a token that an empty header matches;
        # spaces around it (a newline from a file) could never be matched: HTTP drops them.
        value = "" if token is None else token.get_secret_value().strip()
        return SecretStr(value) if value else None

    def token_path(self, port: int | None = None) -> Path:
        """Where a generated token for the service on ``port`` (default: ``self.port``) is
        written: ``token_file`` when set, else ``~/.scalewatch/token-<port>``."""
        if self.token_file is not None:
            return self.token_file
        return TOKEN_DIR / f"token-{self.port if port is None else port}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
