"""Chart buckets that can no longer change, kept between a service's chart requests.

A bucket of ``width`` steps is sealed once the run's last stored step reaches its end:
steps are appended past the last one, and a write at or below it (a retried batch, a
resume from an older checkpoint) counts in ``runs.step_rewrites``, which a kept bucket is
checked against. A chart then reads only what it has not seen: a partial bucket at its
start, the sealed buckets no earlier chart read, and the buckets still filling at the end.
Whole-run charts of a live run, asked again and again, read a few new buckets each.

Thread: the service's chart threads, several at once (a lock guards the buckets).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_BUCKETS", "ChartCache", "Span"]

# About 0.5 KB a bucket: a whole-run chart of 2000 points for each of 100 runs fits.
MAX_BUCKETS = 200_000

Span = tuple[int, int]  # first and last step, inclusive
Row = Sequence[Any]  # a bucket as the chart query answers it: its first step leads


@dataclass
class _Buckets:
    """The sealed buckets of one run at one width, read when ``rewrites`` was current."""

    rewrites: int
    rows: dict[int, Row] = field(default_factory=dict)  # bucket index: row (empty ones absent)
    known: list[Span] = field(default_factory=list)  # bucket indexes [a, b), sorted, apart

    def missing(self, first: int, end: int) -> list[Span]:
        """The bucket indexes of ``[first, end)`` not read yet, as ``[a, b)`` spans."""
        spans, at = [], first
        for a, b in self.known:
            if b <= at:
                continue
            if a >= end:
                break
            if a > at:
                spans.append((at, a))
            at = max(at, b)
        if at < end:
            spans.append((at, end))
        return spans

    def add(self, spans: Sequence[Span], rows: Sequence[Row], width: int) -> None:
        """Keep ``rows``, the buckets of ``spans`` (bucket indexes, all read)."""
        for row in rows:
            self.rows[row[0] // width] = row
        merged: list[Span] = []
        for a, b in sorted([*self.known, *spans]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.known = merged


class ChartCache:
    """Sealed chart buckets by run and width, the least recently charted dropped first
    once more than ``max_buckets`` are kept."""

    def __init__(self, max_buckets: int = MAX_BUCKETS) -> None:
        self.max_buckets = max_buckets
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[int, int], _Buckets] = OrderedDict()
        self._count = 0
        self.read_buckets = 0  # buckets the store was asked for
        self.kept_buckets = 0  # buckets answered from here

    def __len__(self) -> int:
        """The buckets kept."""
        return self._count

    @property
    def charts(self) -> int:
        """The runs and widths buckets are kept of."""
        return len(self._kept)

    def series_rows(
        self,
        run: int,
        width: int,
        *,
        rewrites: int,
        span: Span,
        stored: Span,
        read: Callable[[list[Span]], Sequence[Row]],
    ) -> list[Row]:
        """The buckets of steps ``span`` in step order, given the run's ``stored`` first
        and last steps; ``read`` answers the buckets of the step spans it is given, in step
        order (buckets aligned to multiples of ``width``)."""
        lo, hi = span
        first_index, last_index = lo // width, hi // width
        head = lo > first_index * width and lo > stored[0]  # bucket holds steps before lo
        tail = hi < (last_index + 1) * width - 1 and hi < stored[1]  # ... or after hi
        begin = first_index + head
        sealed = (stored[1] + 1) // width  # the buckets before it hold every step they will
        end = max(begin, min(last_index + 1 - tail, sealed))
        with self._lock:
            buckets = self._buckets(run, width, rewrites)
            missing = buckets.missing(begin, end)
        spans = [(lo, min(hi, begin * width - 1))] if head else []
        spans += [(a * width, b * width - 1) for a, b in missing]
        if end <= last_index:
            spans.append((max(lo, end * width), hi))
        rows = read(spans) if spans else ()
        before = [row for row in rows if row[0] // width < begin]
        after = [row for row in rows if row[0] // width >= end]
        new = [row for row in rows if begin <= row[0] // width < end]
        with self._lock:
            if self._kept.get((run, width)) is buckets:
                held = len(buckets.rows)
                buckets.add(missing, new, width)
                self._count += len(buckets.rows) - held
                self._shrink()
                kept = [buckets.rows[i] for i in range(begin, end) if i in buckets.rows]
            else:  # dropped or reset meanwhile: what it held, and what was just read
                by_index = {i: row for i, row in buckets.rows.items() if begin <= i < end}
                by_index.update((row[0] // width, row) for row in new)
                kept = [by_index[i] for i in sorted(by_index)]
            self.read_buckets += len(rows)
            self.kept_buckets += len(kept) - len(new)
        return [*before, *kept, *after]

    def _buckets(self, run: int, width: int, rewrites: int) -> _Buckets:
        key = (run, width)
        buckets = self._kept.get(key)
        if buckets is None or buckets.rewrites != rewrites:
            if buckets is not None:
                self._count -= len(buckets.rows)
            buckets = self._kept[key] = _Buckets(rewrites)
        self._kept.move_to_end(key)
        return buckets

    def _shrink(self) -> None:
        while self._count > self.max_buckets and len(self._kept) > 1:
            _, dropped = self._kept.popitem(last=False)
            self._count -= len(dropped.rows)
