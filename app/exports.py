"""Export formats shared by the HTTP endpoint and the CLI: CSV and JSON Lines, page by page."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

from scalewatch.store import queries
from scalewatch.store.diagnosis import Finding, finding_dicts, findings_between
from scalewatch.store.engine import Store
from scalewatch.store.queries import EXPORT_COLUMNS
from scalewatch.store.step_schema import STEP_FIELDS, Kind

__all__ = ["MEDIA_TYPES", "OVERFLOW_COLUMNS", "export_chunks", "export_filename", "format_params"]

MEDIA_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


def export_filename(run_name: str, run_id: int, what: str, fmt: str) -> str:
    """A safe file name: ``export_filename("bert large/fp16", 3, "steps", "csv")`` is
    ``"bert-large-fp16-3-steps.csv"``."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", run_name).strip("-._")[:80] or "run"
    return f"{stem}-{run_id}-{what}.{fmt}"


_ROW = ",".join(["%s"] * len(EXPORT_COLUMNS)) + "\n"
_RANKS = tuple(i for i, f in enumerate(STEP_FIELDS) if f.kind is Kind.RANKS)
# Nullable numbers: floats or ints, or None.
_MAYBE = tuple(
    i for i, f in enumerate(STEP_FIELDS) if f.nullable and f.kind in (Kind.INT, Kind.FLOAT)
)
_GROUPS = tuple(i for i, f in enumerate(STEP_FIELDS) if f.kind is Kind.FLOAT_GROUPS)  # JSON or None
# Float columns that hold few distinct values a page: each repr is computed once.
_REPEATING = tuple(i for i, f in enumerate(STEP_FIELDS) if f.few_values)


def csv_page(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as CSV text, exactly what ``csv.writer(f, lineterminator="\\n")`` writes.

    ``csv_page([(2, 0.5, 1.0, 1, 1, "0,3", 0.5, 0, 2, 2.0, 0.5, 0, None, "1", 0, 0.1, None, 3)])``
    is ``'2,0.5,1.0,1,1,"0,3",0.5,0,2,2.0,0.5,0,,1,0,0.1,,3\\n'``.

    A step row is numbers, ranks strings, a loss and a learning rate that may be None and
    (mostly) no learning rates by group, so one ``%`` over the whole page does what
    csv.writer does field by field (``str`` of a float is its ``repr``, None is empty) at
    about twice the speed. Only ranks with a comma need quotes; any other field that would
    need quoting, or is None, shows in the counts checked below and sends the page to
    csv.writer, as does a page with learning rates by group.
    """
    width = len(EXPORT_COLUMNS)
    values = list(chain.from_iterable(rows))
    for column in _GROUPS:
        if values[column::width].count(None) != len(rows):
            return _csv_writer_page(rows)
        values[column::width] = [""] * len(rows)
    commas = quoted = 0
    for column in _RANKS:
        ranks = values[column::width]
        try:
            joined = "".join(ranks)
        except TypeError:
            return _csv_writer_page(rows)
        if '"' in joined or "\r" in joined or "\n" in joined:
            return _csv_writer_page(rows)
        if "," in joined:
            commas += joined.count(",")
            values[column::width] = [f'"{r}"' if "," in r else r for r in ranks]
            quoted += sum(1 for r in ranks if "," in r)
    for column in _MAYBE:
        maybe = values[column::width]
        if None in maybe:
            values[column::width] = ["" if v is None else v for v in maybe]
    for column in _REPEATING:
        values[column::width] = _float_reprs(values[column::width])
    text = (_ROW * len(rows)) % tuple(values)
    if (
        text.count(",") != (width - 1) * len(rows) + commas
        or text.count('"') != 2 * quoted
        or text.count("\n") != len(rows)
        or "\r" in text
        or "None" in text
    ):
        return _csv_writer_page(rows)
    return text


def _float_reprs(column: list[Any]) -> list[Any]:
    """``repr`` of each float of a column of few distinct floats; else the column as is.

    Equal floats have equal reprs except 0.0 and -0.0, so a column with a zero is left
    alone, as is one with a value that is not a float (2 == 2.0).
    """
    distinct = set(column)
    if len(distinct) > 64 or 0.0 in distinct or set(map(type, column)) != {float}:
        return column
    return list(map({value: repr(value) for value in distinct}.__getitem__, column))


def _csv_writer_page(rows: Iterable[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def _csv(pages: Iterator[list[tuple[Any, ...]]]) -> Iterator[str]:
    yield _csv_writer_page([EXPORT_COLUMNS])
    for page in pages:
        yield csv_page(page)


def _jsonl(pages: Iterator[list[tuple[Any, ...]]]) -> Iterator[str]:
    for page in pages:
        yield "".join(json.dumps(queries.step_dict(row)) + "\n" for row in page)


OVERFLOW_COLUMNS: tuple[str, ...] = (*EXPORT_COLUMNS, "params")


def format_params(findings: Iterable[Finding]) -> str:
    """The compact CSV form of an overflow's findings, ``rank:name:kind:count`` joined by
    ``;``: ``format_params([(1, "fc.weight", "inf", 12), (0, "fc.bias", "nan", 3)])`` is
    ``"1:fc.weight:inf:12;0:fc.bias:nan:3"``. A name is what lies between the first colon
    and the last two."""
    return ";".join(f"{rank}:{name}:{kind}:{count}" for rank, name, kind, count in findings)


def _with_findings(
    store: Store, run_id: int, pages: Iterator[list[tuple[Any, ...]]]
) -> Iterator[tuple[list[tuple[Any, ...]], dict[int, list[Finding]]]]:
    """Each page of overflow rows with the findings of its steps (one range read a page)."""
    for page in pages:
        with store.engine.connect() as conn:
            found = findings_between(conn, run_id, page[0][0], page[-1][0])
        yield page, found


def _overflows_csv(
    pages: Iterator[tuple[list[tuple[Any, ...]], dict[int, list[Finding]]]],
) -> Iterator[str]:
    yield _csv_writer_page([OVERFLOW_COLUMNS])
    for page, found in pages:
        yield _csv_writer_page([(*row, format_params(found.get(row[0], ()))) for row in page])


def _overflows_jsonl(
    pages: Iterator[tuple[list[tuple[Any, ...]], dict[int, list[Finding]]]],
) -> Iterator[str]:
    for page, found in pages:
        yield "".join(
            json.dumps({**queries.step_dict(row), "params": finding_dicts(found.get(row[0], ()))})
            + "\n"
            for row in page
        )


def export_chunks(
    store: Store,
    run_id: int,
    *,
    what: str = "steps",
    fmt: str = "csv",
    start: int | None = None,
    end: int | None = None,
) -> Iterator[str]:
    """The export as text chunks of one store page each; ``what`` is steps or overflows.

    An overflows export has the steps' columns and ``params``, the findings of each step.
    """
    overflows = what == "overflows"
    pages = queries.iter_step_pages(store, run_id, start=start, end=end, overflows_only=overflows)
    if overflows:
        paged = _with_findings(store, run_id, pages)
        return _overflows_csv(paged) if fmt == "csv" else _overflows_jsonl(paged)
    return _csv(pages) if fmt == "csv" else _jsonl(pages)
