"""step_rollups rebuilt with five levels 8 times apart (64, 512, 4096, 32768, 262144 steps)

Revision ID: 394d114978d2
Revises: 4bfa51145dc1
Create Date: 2025-01-03 00:00:00.000000

With levels 64 times apart, a chart of a window of a few million steps read up to 64k
level-1 rows; with levels 8 times apart a window read from rollups reads at most about
four rows per returned bucket. The level numbers change meaning (old level 2, 4096
steps, is new level 3), so every run's rollups are deleted and recomputed in SQL, level
by level: the finest from ``steps``, each coarser one from the level below it. The
downgrade recomputes the three old levels the same way. The schema itself does not
change. Either way takes about 12 s per 10M stored steps (2 CPUs), under the store's
write lock.

The levels are written out here rather than read from ``scalewatch.store.schema``: this
revision must keep producing these levels whatever the schema says later.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "394d114978d2"
down_revision: str | Sequence[str] | None = "4bfa51145dc1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# {level: bucket width in steps}, after and before this revision.
NEW_LEVELS: dict[int, int] = {1: 64, 2: 512, 3: 4096, 4: 32768, 5: 262144}
OLD_LEVELS: dict[int, int] = {1: 64, 2: 4096, 3: 262144}

_COLUMNS = (
    "run_id, level, bucket, first_step, last_step, n, scale_min, scale_max, scale_last,"
    " tracker_min, tracker_max, tracker_last, overflows, skipped"
)
# Aliases are prefixed: SQLite resolves a bare name in WHERE/GROUP BY to a result alias.
# Rows go in in key order, which is the order of the WITHOUT ROWID b-tree.
_FROM_STEPS = (
    f"INSERT INTO step_rollups ({_COLUMNS})"
    " SELECT a.agg_run, {level}, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    " a.agg_scale_min, a.agg_scale_max, s.scale_after,"
    " a.agg_tracker_min, a.agg_tracker_max, s.growth_tracker, a.agg_overflows, a.agg_skipped"
    " FROM (SELECT run_id AS agg_run, step / {width} AS agg_bucket, min(step) AS agg_first,"
    " max(step) AS agg_last, count(*) AS agg_n,"
    " {least}(min(scale), min(scale_after)) AS agg_scale_min,"
    " {greatest}(max(scale), max(scale_after)) AS agg_scale_max,"
    " min(growth_tracker) AS agg_tracker_min, max(growth_tracker) AS agg_tracker_max,"
    " sum(CAST(overflow AS INTEGER)) AS agg_overflows,"
    " sum(CAST(skipped AS INTEGER)) AS agg_skipped"
    " FROM steps GROUP BY run_id, step / {width}) AS a"
    " JOIN steps AS s ON s.run_id = a.agg_run AND s.step = a.agg_last"
    " ORDER BY a.agg_run, a.agg_bucket"
)
_FROM_CHILD = (
    f"INSERT INTO step_rollups ({_COLUMNS})"
    " SELECT a.agg_run, {level}, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    " a.agg_scale_min, a.agg_scale_max, c.scale_last,"
    " a.agg_tracker_min, a.agg_tracker_max, c.tracker_last, a.agg_overflows, a.agg_skipped"
    " FROM (SELECT run_id AS agg_run, bucket / {ratio} AS agg_bucket,"
    " min(first_step) AS agg_first, max(last_step) AS agg_last, sum(n) AS agg_n,"
    " min(scale_min) AS agg_scale_min, max(scale_max) AS agg_scale_max,"
    " min(tracker_min) AS agg_tracker_min, max(tracker_max) AS agg_tracker_max,"
    " sum(overflows) AS agg_overflows, sum(skipped) AS agg_skipped"
    " FROM step_rollups WHERE level = {child} GROUP BY run_id, bucket / {ratio}) AS a"
    " JOIN step_rollups AS c ON c.run_id = a.agg_run AND c.level = {child}"
    " AND c.bucket = a.agg_last / {child_width}"
    " ORDER BY a.agg_run, a.agg_bucket"
)


def _rebuild(levels: dict[int, int]) -> None:
    """Replace every run's rollups with ``levels``, computed finest first.

    A level whose width is a multiple of the previous (finer) one is merged from that
    level's rows, otherwise it is aggregated from ``steps``.
    """
    op.execute("DELETE FROM step_rollups")
    # SQLite's min() and max() of two values are PostgreSQL's LEAST() and GREATEST().
    pair = ("min", "max") if op.get_bind().dialect.name == "sqlite" else ("LEAST", "GREATEST")
    child: tuple[int, int] | None = None
    for level, width in sorted(levels.items(), key=lambda item: item[1]):
        if child is None or width % child[1] != 0:
            op.execute(
                _FROM_STEPS.format(
                    level=int(level), width=int(width), least=pair[0], greatest=pair[1]
                )
            )
        else:
            op.execute(
                _FROM_CHILD.format(
                    level=int(level),
                    child=int(child[0]),
                    child_width=int(child[1]),
                    ratio=int(width // child[1]),
                )
            )
        child = (level, width)


def upgrade() -> None:
    _rebuild(NEW_LEVELS)


def downgrade() -> None:
    _rebuild(OLD_LEVELS)
