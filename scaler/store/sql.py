"""SQL the store runs on a driver's own cursor, written once for both backends.

Statements are written for sqlite3 (``?`` and ``:name`` parameters) with ``LEAST`` and
``GREATEST`` for the smaller and larger of two values; :func:`driver_sql` turns them into
what the connection's driver reads.

>>> driver_sql("SELECT LEAST(a, b) FROM t WHERE id = ? AND n > :n", "sqlite")
'SELECT min(a, b) FROM t WHERE id = ? AND n > :n'
>>> driver_sql("SELECT LEAST(a, b) FROM t WHERE id = ? AND n > :n", "postgresql")
'SELECT LEAST(a, b) FROM t WHERE id = %s AND n > %(n)s'
"""

from __future__ import annotations

import functools
import re
import sqlite3
from typing import Any

__all__ = ["cursor_dialect", "driver_sql"]

# A parameter outside a quoted string: ``?`` or ``:name`` (not the ``::`` of a cast).
_PARAMETER = re.compile(r"'[^']*'|(?<!:)(\?|:[A-Za-z_]\w*)")


@functools.cache
def driver_sql(sql: str, dialect: str) -> str:
    """``sql`` for a connection of ``dialect`` (``"sqlite"`` or ``"postgresql"``)."""
    if dialect == "sqlite":
        return sql.replace("LEAST(", "min(").replace("GREATEST(", "max(")
    return _PARAMETER.sub(_psycopg_parameter, sql.replace("%", "%%"))


def _psycopg_parameter(match: re.Match[str]) -> str:
    parameter = match.group(1)
    if parameter is None:
        return match.group(0)
    return "%s" if parameter == "?" else f"%({parameter[1:]})s"


def cursor_dialect(cursor: Any) -> str:
    """The dialect name of a driver cursor: ``"sqlite"`` or ``"postgresql"``."""
    return "sqlite" if isinstance(cursor, sqlite3.Cursor) else "postgresql"
