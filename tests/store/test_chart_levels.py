"""How many rows a chart query reads: about four rollup rows per bucket, whatever the window."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from scalewatch.store.charts import _bucket_width, _pieces
from scalewatch.store.schema import ROLLUP_LEVELS

WIDTHS = sorted(ROLLUP_LEVELS.values())


def test_levels_are_at_most_8_times_apart() -> None:
    for finer, coarser in pairwise(WIDTHS):
        assert coarser % finer == 0 and coarser // finer <= 8


@given(
    lo=st.integers(0, 10**9),
    span=st.integers(1, 2 * 10**8),
    max_points=st.sampled_from([2, 3, 100, 1000, 2000, 10000]),
)
def test_a_window_reads_about_four_rows_per_bucket(lo: int, span: int, max_points: int) -> None:
    hi = lo + span - 1
    width, levels = _bucket_width(span, max_points)
    pieces = _pieces(lo, hi, levels)
    widths = dict(levels) | {0: 1}
    covered = [
        (first * widths[level], (last + 1) * widths[level] - 1) for level, first, last in pieces
    ]
    # The pieces tile [lo, hi] exactly, and each is whole buckets of the chart's width.
    assert covered[0][0] == lo and covered[-1][1] == hi
    assert all(a[1] + 1 == b[0] for a, b in pairwise(covered))
    assert all(widths[level] <= width and width % widths[level] == 0 for level, _, _ in pieces)
    rows = sum(last - first + 1 for level, first, last in pieces if level)
    raw = sum(last - first + 1 for level, first, last in pieces if not level)
    if levels:  # partial coarser buckets at both ends: fewer than 8 per level and side
        assert rows <= max(4 * max_points, span // WIDTHS[-1] + 1) + 2 * 7 * len(WIDTHS)
        assert raw <= 2 * (WIDTHS[0] - 1)
    else:  # buckets narrower than a quarter of the finest level: steps only
        assert rows == 0 and raw == span <= WIDTHS[0] // 4 * max_points
    assert hi // width - lo // width + 1 <= max_points  # the chart's buckets
