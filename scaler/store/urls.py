"""Where a store is: its URL as written or a SQLite file's path, the default, and the URL
as logs and errors show it. Any thread, any process; no connection is made here."""

from __future__ import annotations

import os

from sqlalchemy import URL, exc, make_url

from .errors import NotAStoreURL

ENV_VAR = "SCALEWATCH_DB"
DEFAULT_URL = "sqlite:///scalewatch.db"


def store_url(value: str) -> str:
    """A store URL as it is; anything else is the path of a SQLite file (``~`` expanded,
    and characters a URL would read otherwise, such as ``?`` and ``%``, escaped).

    >>> store_url("runs/sw.db"), store_url("/tmp/a?b.db"), store_url("sqlite:///sw.db")
    ('sqlite:///runs/sw.db', 'sqlite:////tmp/a%3Fb.db', 'sqlite:///sw.db')
    """
    if "://" in value or value.startswith("sqlite:"):
        return value
    path = os.path.expanduser(value)
    return URL.create("sqlite", database=path).render_as_string(hide_password=False)


def parse_store_url(value: str) -> URL:
    """:func:`store_url` of ``value``, parsed; :class:`NotAStoreURL` for another database
    than SQLite or PostgreSQL."""
    url = store_url(value)
    parsed = make_url(url)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise NotAStoreURL(parsed.render_as_string(hide_password=True))
    return parsed


def shown_url(url: str | URL) -> str:
    """``url`` as logs, errors and output show it: its password masked.

    >>> shown_url("postgresql+psycopg://me:secret@db/sw")
    'postgresql+psycopg://me:***@db/sw'
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except exc.ArgumentError:
        return str(url)
    if parsed.password is None:
        return url if isinstance(url, str) else parsed.render_as_string(hide_password=False)
    return parsed.render_as_string(hide_password=True)


def sqlite_file(url: URL) -> str | None:
    """The file a SQLite store ``url`` names, as written; None for another database, an
    in-memory one or a ``file:`` URI (whose path SQLite reads itself).

    >>> sqlite_file(make_url("sqlite:///runs/sw.db")), sqlite_file(make_url("sqlite://"))
    ('runs/sw.db', None)
    """
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    return None if database.startswith("file:") else database


def pinned_url(value: str | None) -> str:
    """The store ``value`` names (None: :func:`default_url`), as any process reads it
    alike: a SQLite file's relative path made absolute against this process's working
    directory. For a process of our own that opens the store, whatever its environment
    and folder have become since it started.

    >>> pinned_url("runs/sw.db") == "sqlite:///" + os.path.abspath("runs/sw.db")
    True
    >>> pinned_url("sqlite:////data/sw.db?timeout=5"), pinned_url("sqlite://")
    ('sqlite:////data/sw.db?timeout=5', 'sqlite://')
    """
    written = store_url(value or default_url())
    try:
        url = make_url(written)
    except exc.ArgumentError:  # not a URL: the store's opening says so, as for any process
        return written
    path = sqlite_file(url)
    if path is not None:
        url = url.set(database=os.path.abspath(path))
    return url.render_as_string(hide_password=False)


def default_url() -> str:
    """``$SCALEWATCH_DB`` when set, else ``sqlite:///scalewatch.db`` (relative to the cwd)."""
    return os.environ.get(ENV_VAR) or DEFAULT_URL
