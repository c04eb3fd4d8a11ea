"""A throwaway PostgreSQL cluster for the tests: ``initdb`` and ``pg_ctl`` in a temporary
directory, on a free 127.0.0.1 port, run as an unprivileged user when the tests run as root
(the server refuses to run as root). Each test gets a database of its own, copied from a
template at the store's head, which is much faster than upgrading each one.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests._helpers.net import free_port

HOW_TO_GET_ONE = (
    "no PostgreSQL server binaries (initdb, pg_ctl) found: install them with"
    " `apt-get install postgresql` (or put their directory on PATH) to run the PostgreSQL tests"
)
START_TIMEOUT_S = 60
# The tests' server trusts 127.0.0.1, so the password is never checked; it must still
# never be shown.
PASSWORD = "pg-s3cret-pw"


def server_bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    return Path(found[-1]).parent if found else None


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "nobody", "--", *argv]


@dataclass
class Cluster:
    """A cluster in ``root``; superuser ``postgres``, trusted on 127.0.0.1 only."""

    bindir: Path
    root: Path
    port: int
    _names: Iterator[int] = field(default_factory=itertools.count)
    settings: Sequence[str] = ()  # more server settings, "name=value" each

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str) -> None:
        """Run ``statement`` in the ``postgres`` database, outside a transaction."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(statement)  # type: ignore[arg-type]  # test-only DDL of our own

    def new_database(self, template: str | None = None) -> str:
        """A fresh database (a copy of ``template`` if given); returns its name."""
        name = f"t{os.getpid()}_{next(self._names)}"
        self.sql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        return name

    def drop_database(self, name: str) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def _pg_ctl(self, *args: str, check: bool) -> None:
        argv = [str(self.bindir / "pg_ctl"), *args, "-D", str(self.datadir)]
        subprocess.run(_as_server_user(argv), check=check, capture_output=True)

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=200 -c shared_buffers=64MB"
        ) + "".join(f" -c {setting}" for setting in self.settings)
        log = str(self.root / "server.log")
        self._pg_ctl(
            "start", "-w", "-t", str(START_TIMEOUT_S), "-o", options, "-l", log, check=True
        )

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server: ``immediate`` at the end (the cluster runs without fsync and
        synchronous commit, so it may lose recent commits), ``fast`` to restart it (every
        client's connection is closed, as by a server restart, and nothing is lost)."""
        self._pg_ctl("stop", "-m", mode, check=False)


@contextlib.contextmanager
def cluster(bindir: Path, settings: Sequence[str] = ()) -> Iterator[Cluster]:
    """Start a cluster in a temporary directory (with ``settings``, "name=value" each, beside
    the tests' own); stop it and remove the directory after."""
    root = Path(tempfile.mkdtemp(prefix="scalewatch-pg-"))
    try:
        if os.geteuid() == 0:
            os.chmod(root, 0o755)
            shutil.chown(root, "nobody")
        initdb = [str(bindir / "initdb"), "-D", str(root / "data"), "-U", "postgres"]
        initdb += ["--auth=trust", "-E", "UTF8", "--no-sync"]
        subprocess.run(_as_server_user(initdb), check=True, capture_output=True)
        server = Cluster(bindir, root, free_port(), settings=settings)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
