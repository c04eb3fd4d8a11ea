"""``scalewatch export``: a run's steps or overflows as CSV or JSON Lines."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

import click

from ._common import Failed, Refused, command, db_option, existing_store

__all__ = ["export"]

PROGRESS_S = 0.5  # how often a long export to a file shows its rows on a terminal


@command("export", help="Export a run's steps or overflows as CSV or JSON Lines.")
@click.argument("run", type=int)
@click.option(
    "--what",
    type=click.Choice(["steps", "overflows"]),
    default="steps",
    show_default=True,
    help="every step, or only the steps that overflowed",
)
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv",
              show_default=True)  # fmt: skip
@click.option("--start", type=int, metavar="STEP", help="first step (default: the first)")
@click.option("--end", type=int, metavar="STEP", help="last step (default: the last)")
@click.option("-o", "--output", metavar="FILE", help="file to write (default: standard output)")
@db_option
def export(
    run: int,
    what: str,
    fmt: str,
    start: int | None,
    end: int | None,
    output: str | None,
    db: str | None,
) -> None:
    from scalewatch.store.engine import open_store
    from scalewatch.store.queries import run_status

    from ..exports import export_chunks

    refused = step_range_refused(start, end)
    if refused is not None:  # before a byte of output
        raise Refused(refused)
    with open_store(existing_store(), check=True) as store:
        if run_status(store, run) is None:
            raise Failed(f"no run {run}")
        chunks = export_chunks(store, run, what=what, fmt=fmt, start=start, end=end)
        if output is None:
            sys.stdout.writelines(chunks)
        else:
            if sys.stderr.isatty():
                chunks = _counted(chunks, header=fmt == "csv", out=sys.stderr)
            _write_whole(Path(output), chunks)


def step_range_refused(start: int | None, end: int | None) -> str | None:
    """Why ``start`` and ``end`` are refused, as one line; None if they are taken. The
    bounds are the API's own (:data:`scalewatch.app.models.Step`), which it refuses with 422; a
    start after the end, which the API answers with an empty range, is a usage mistake.

    >>> step_range_refused(9, 3)
    '--start 9 is after --end 3'
    """
    from pydantic import TypeAdapter, ValidationError

    from ..models import Step

    step = TypeAdapter(Step)
    for name, value in (("--start", start), ("--end", end)):
        try:
            if value is not None:
                step.validate_python(value)
        except ValidationError as error:
            return f"{name} {value}: {error.errors()[0]['msg']}"
    if start is not None and end is not None and start > end:
        return f"--start {start} is after --end {end}"
    return None


def _counted(chunks: Iterable[str], *, header: bool, out: TextIO) -> Iterator[str]:
    """``chunks`` as they come, the rows so far shown on ``out`` (a terminal) as they grow."""
    rows = -1 if header else 0  # a CSV's first line names the columns
    shown = time.monotonic()
    for chunk in chunks:
        rows += chunk.count("\n")
        if time.monotonic() - shown >= PROGRESS_S:
            print(f"\rscalewatch export: {rows:,} rows", end="", file=out, flush=True)
            shown = time.monotonic()
        yield chunk
    print(f"\rscalewatch export: {max(rows, 0):,} rows written", file=out, flush=True)


def _write_whole(path: Path, chunks: Iterable[str]) -> None:
    """Write ``chunks`` to ``path`` through a file beside it, renamed over it at the end: an
    export that fails or is interrupted leaves ``path`` as it was, and no part file.

    A path that is no regular file (``/dev/stdout``, a pipe) is written to as it is.
    """
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8", newline="") as out:
            out.writelines(chunks)
        return
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: the directory {path.parent} does not exist")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
    handle, part = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with open(handle, "w", encoding="utf-8", newline="") as out:
            out.writelines(chunks)
        os.chmod(part, mode)  # as a file opened for writing would have it, not mkstemp's 0600
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
