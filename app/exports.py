"""Export formats shared by the HTTP endpoint and the CLI: CSV and JSON Lines, page by page."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from typing import Any

from scaler.store import queries
from scaler.store.engine import Store
from scaler.store.queries import EXPORT_COLUMNS

__all__ = ["MEDIA_TYPES", "export_chunks", "export_filename"]

MEDIA_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


def export_filename(run_name: str, run_id: int, what: str, fmt: str) -> str:
    """A safe file name: ``export_filename("bert large/fp16", 3, "steps", "csv")`` is
    ``"bert-large-fp16-3-steps.csv"``."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", run_name).strip("-._")[:80] or "run"
    return f"{stem}-{run_id}-{what}.{fmt}"


def _csv(pages: Iterator[list[tuple[Any, ...]]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    for page in pages:
        writer.writerows(page)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()


def _jsonl(pages: Iterator[list[tuple[Any, ...]]]) -> Iterator[str]:
    for page in pages:
        yield "".join(json.dumps(queries.step_dict(row)) + "\n" for row in page)


def export_chunks(
    store: Store,
    run_id: int,
    *,
    what: str = "steps",
    fmt: str = "csv",
    start: int | None = None,
    end: int | None = None,
) -> Iterator[str]:
    """The export as text chunks of one store page each; ``what`` is steps or overflows."""
    pages = queries.iter_step_pages(
        store, run_id, start=start, end=end, overflows_only=what == "overflows"
    )
    return _csv(pages) if fmt == "csv" else _jsonl(pages)
