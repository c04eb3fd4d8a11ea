"""Read queries of the overflow diagnosis: the parameters found at overflow steps.

``overflow_params`` is keyed by ``(run_id, step, rank, name)``, so the findings of a range
of steps are one range of its primary key, read in step, rank, name order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection

from .engine import Store
from .queries import BEFORE_FIRST_STEP, EXPORT_COLUMNS, INT64_MAX, parse_ranks, step_dict
from .sql import driver_sql

__all__ = [
    "Finding",
    "OverflowLookup",
    "OverflowPage",
    "ParamRank",
    "ParamRanking",
    "finding_dicts",
    "findings_between",
    "overflow_detail",
    "overflow_page",
    "param_ranking",
]

# (rank, name, kind, count) of one parameter on one rank.
Finding = tuple[int, str, str, int]

_FINDINGS = (
    "SELECT step, rank, name, kind, count FROM overflow_params"
    " WHERE run_id = :run AND step >= :lo AND step <= :hi ORDER BY step, rank, name"
)


def findings_between(conn: Connection, run_id: int, lo: int, hi: int) -> dict[int, list[Finding]]:
    """The findings of steps ``lo..hi`` by step; a step without any is absent."""
    cursor = conn.connection.cursor()  # the driver's own: a page may hold many findings
    try:
        cursor.execute(
            driver_sql(_FINDINGS, conn.dialect.name), {"run": run_id, "lo": lo, "hi": hi}
        )
        rows = cursor.fetchall()
    finally:
        cursor.close()
    return {
        step: [finding[1:] for finding in group] for step, group in groupby(rows, key=itemgetter(0))
    }


def finding_dicts(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """``[(1, "fc.weight", "inf", 12)]`` -> ``[{"rank": 1, "name": "fc.weight", ...}]``."""
    return [
        {"rank": rank, "name": name, "kind": kind, "count": count}
        for rank, name, kind, count in findings
    ]


_STEP = "SELECT {columns} FROM steps WHERE run_id = :run AND step = :step".format(
    columns=", ".join(EXPORT_COLUMNS)
)


@dataclass(frozen=True)
class OverflowLookup:
    """What :func:`overflow_detail` found: the step row as a dict (None: no such step) and,
    when it is an overflow, its findings."""

    step: dict[str, Any] | None
    params: list[dict[str, Any]]

    @property
    def is_overflow(self) -> bool:
        return self.step is not None and bool(self.step["overflow"])


def overflow_detail(store: Store, run_id: int, step: int) -> OverflowLookup:
    """The stored step ``step`` of the run and, if it overflowed, every finding of it."""
    with store.engine.connect() as conn:
        row = conn.exec_driver_sql(
            driver_sql(_STEP, conn.dialect.name), {"run": run_id, "step": step}
        ).first()
        if row is None:
            return OverflowLookup(None, [])
        values = step_dict(tuple(row))
        if not values["overflow"]:
            return OverflowLookup(values, [])
        found = findings_between(conn, run_id, step, step).get(step, [])
    return OverflowLookup(values, finding_dicts(found))


@dataclass(frozen=True)
class ParamRank:
    """A parameter with the overflow steps of a window it was found non-finite at."""

    name: str
    overflows: int  # overflow steps it was found at
    ranks: list[int]  # the ranks it was found on
    kinds: list[str]  # of inf, nan, both
    last_step: int  # the latest of those steps
    count: int  # non-finite elements, summed over its findings


@dataclass(frozen=True)
class ParamRanking:
    overflows: int  # overflow steps of the window
    params_omitted: int  # findings of those steps that were not kept
    params: list[ParamRank]


_RANKED = (
    "SELECT name, count(DISTINCT step) AS overflows, max(step) AS last_step,"
    " sum(count) AS elements FROM overflow_params"
    " WHERE run_id = :run AND step >= :lo AND step <= :hi GROUP BY name"
    " ORDER BY overflows DESC, last_step DESC, name LIMIT :limit"
)
_SPREAD = (
    "SELECT DISTINCT name, rank, kind FROM overflow_params"
    " WHERE run_id = :run AND step >= :lo AND step <= :hi AND name IN ({names})"
)
_OVERFLOW_TOTALS = (
    "SELECT count(*), coalesce(sum(params_omitted), 0) FROM steps"
    " WHERE run_id = :run AND overflow AND step >= :lo AND step <= :hi"
)


def param_ranking(
    store: Store,
    run_id: int,
    *,
    start: int | None = None,
    end: int | None = None,
    limit: int = 20,
) -> ParamRanking:
    """The ``limit`` parameters found at the most overflow steps in ``start..end`` (default:
    the whole run), most first; ties go to the one seen latest, then by name."""
    lo, hi = 0 if start is None else start, INT64_MAX if end is None else end
    bounds = {"run": run_id, "lo": lo, "hi": hi}
    with store.engine.connect() as conn:
        dialect = conn.dialect.name
        totals = conn.exec_driver_sql(driver_sql(_OVERFLOW_TOTALS, dialect), bounds).one()
        ranked = conn.exec_driver_sql(
            driver_sql(_RANKED, dialect), {**bounds, "limit": limit}
        ).fetchall()
        spread: dict[str, tuple[set[int], set[str]]] = {row[0]: (set(), set()) for row in ranked}
        if ranked:
            names = {f"n{i}": row[0] for i, row in enumerate(ranked)}
            sql = _SPREAD.format(names=", ".join(f":{key}" for key in names))
            for name, rank, kind in conn.exec_driver_sql(
                driver_sql(sql, dialect), {**bounds, **names}
            ):
                spread[name][0].add(rank)
                spread[name][1].add(kind)
    return ParamRanking(
        overflows=int(totals[0]),
        params_omitted=int(totals[1]),
        params=[
            ParamRank(
                name=name,
                overflows=int(overflows),
                ranks=sorted(spread[name][0]),
                kinds=sorted(spread[name][1]),
                last_step=int(last),
                count=int(elements),
            )
            for name, overflows, last, elements in ranked
        ],
    )


@dataclass(frozen=True)
class OverflowPage:
    items: list[dict[str, Any]]
    next: int | None


_OVERFLOWS = (
    "SELECT step, wall_time, scale, scale_after, inf_ranks, loss, loss_nonfinite_ranks,"
    " params_omitted FROM steps"
    " WHERE run_id = :run AND overflow AND step > :after ORDER BY step LIMIT :limit"
)


def overflow_page(
    store: Store,
    run_id: int,
    *,
    after: int | None = None,
    limit: int = 100,
    with_params: bool = True,
) -> OverflowPage:
    """Overflow steps after ``after``, oldest first, each with its findings (``params`` None
    without ``with_params``: a chart's markers need no more); ``next`` is the ``after`` of
    the next page."""
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            driver_sql(_OVERFLOWS, conn.dialect.name),
            {
                "run": run_id,
                "after": BEFORE_FIRST_STEP if after is None else after,
                "limit": limit + 1,
            },
        ).fetchall()
        more, rows = len(rows) > limit, rows[:limit]
        found = (
            findings_between(conn, run_id, rows[0][0], rows[-1][0]) if rows and with_params else {}
        )
    items = [
        {
            "step": step,
            "wall_time": wall_time,
            "scale": scale,
            "scale_after": scale_after,
            "inf_ranks": parse_ranks(ranks),
            "loss": loss,
            "loss_nonfinite_ranks": parse_ranks(loss_ranks),
            "params": finding_dicts(found.get(step, ())) if with_params else None,
            "params_omitted": omitted,
        }
        for step, wall_time, scale, scale_after, ranks, loss, loss_ranks, omitted in rows
    ]
    return OverflowPage(items, items[-1]["step"] if more else None)
