"""Errors the store raises for requests it refuses; the service maps them to HTTP answers."""

from __future__ import annotations

import sqlite3

from sqlalchemy import exc


class NotAStoreURL(ValueError):
    """A URL of another database than SQLite or PostgreSQL (the ``url`` shown masked)."""

    def __init__(self, url: str) -> None:
        super().__init__(f"a scalewatch store is a SQLite or PostgreSQL database; got {url!r}")
        self.url = url


class UnsupportedDriver(NotAStoreURL):
    """A PostgreSQL URL naming another driver than psycopg 3, the one the store is tested with."""

    def __init__(self, drivername: str) -> None:
        ValueError.__init__(
            self,
            "a PostgreSQL store is opened through psycopg 3: write the URL as"
            f" 'postgresql+psycopg://...', not {drivername!r}",
        )
        self.url = drivername


class StoreOnNetworkFilesystem(ValueError):
    """A SQLite store on a filesystem other hosts share (``scalewatch.store.filesystems``)."""

    def __init__(self, path: str, fstype: str, mountpoint: str) -> None:
        super().__init__(
            f"the store {path!r} is on a {fstype} filesystem (mounted at {mountpoint}), where"
            " SQLite's WAL and locks do not hold across hosts: put it on a local disk"
            " (SCALEWATCH_DB=/local/path/scalewatch.db) or use PostgreSQL"
            " (postgresql+psycopg://...); if no other host ever opens it, add"
            " ?journal_mode=delete to its URL"
        )
        self.path = path
        self.fstype = fstype
        self.mountpoint = mountpoint


class RunNotFound(LookupError):
    """No run has this id (404)."""

    def __init__(self, run_id: int) -> None:
        super().__init__(f"no run {run_id}")
        self.run_id = run_id


class RunNotRunning(RuntimeError):
    """The run has finished or crashed, so nothing will apply a request (409)."""

    def __init__(self, run_id: int, status: str) -> None:
        super().__init__(f"run {run_id} is {status}, not running")
        self.run_id = run_id
        self.status = status


class RequestNotFound(LookupError):
    """No control request has this id."""

    def __init__(self, request_id: int) -> None:
        super().__init__(f"control request {request_id} not found")
        self.request_id = request_id


class ControlValidationError(ValueError):
    """Refused control values (422). ``errors`` maps each offending field to the rule it breaks."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


class MigrationsUnusable(RuntimeError):
    """The schema's revisions, as installed, cannot bring the store to its head: none are
    found where the package lies, or the store is at a revision they do not know."""

    def __init__(self, problem: str, folder: str) -> None:
        super().__init__(f"the store cannot be opened: {problem} (revisions read from {folder})")
        self.folder = folder


class StoreDamaged(RuntimeError):
    """SQLite's ``quick_check`` finds the store's file damaged, or it is no database at all:
    reading it would fail part-way (the service answers 503)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the store cannot be read: {reason} (in {url}; restore it from a copy)")
        self.url = url
        self.reason = reason


class NotAStore(StoreDamaged):
    """The file a SQLite store URL names is no SQLite database at all (``--db /etc/passwd``):
    nothing was ever a store there, so there is no copy to restore."""

    def __init__(self, url: str, path: str) -> None:
        RuntimeError.__init__(
            self,
            f"{path} is not a scalewatch store: not a SQLite database at all (is --db or"
            " $SCALEWATCH_DB the path you meant?)",
        )
        self.url = url
        self.reason = "not a SQLite database"


# SQLite's primary result codes of a store that cannot be used as it is (the file, the
# disk, a lock), as opposed to a mistake in a statement: sqlite3.h.
_STORAGE_CODES = frozenset(
    {
        3,  # SQLITE_PERM
        5,  # SQLITE_BUSY
        6,  # SQLITE_LOCKED
        8,  # SQLITE_READONLY
        10,  # SQLITE_IOERR
        11,  # SQLITE_CORRUPT
        13,  # SQLITE_FULL
        14,  # SQLITE_CANTOPEN
        15,  # SQLITE_PROTOCOL
        26,  # SQLITE_NOTADB
    }
)


def storage_failure(error: BaseException) -> str | None:
    """The one-line reason when ``error`` (SQLAlchemy's or the driver's) says the store
    cannot be used as it is (damaged, unreadable, full, locked); None for another error.

    >>> storage_failure(sqlite3.DatabaseError("database disk image is malformed"))
    'database disk image is malformed'
    >>> storage_failure(sqlite3.IntegrityError("UNIQUE constraint failed")) is None
    True
    """
    orig = error.orig if isinstance(error, exc.DBAPIError) else error
    if isinstance(orig, StoreDamaged):
        return str(orig)
    if type(orig).__module__.split(".")[0] == "psycopg":  # the server is down or unreachable
        from psycopg import OperationalError

        return str(orig).splitlines()[0] if isinstance(orig, OperationalError) else None
    if not isinstance(orig, sqlite3.DatabaseError):
        return None
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return str(orig).splitlines()[0] if (code & 0xFF) in _STORAGE_CODES else None
    # A driver without error codes (Python 3.10): the classes SQLite's codes map to.
    storage = isinstance(orig, sqlite3.OperationalError) or type(orig) is sqlite3.DatabaseError
    return str(orig).splitlines()[0] if storage else None
