"""step_rollups gain level 6: buckets of 8 steps, the finest

Revision ID: d4b8f2a6c1e9
Revises: c7d3e9a1b5f2
Create Date: 2026-12-02 21:00:00.000000

A chart whose buckets were narrower than 16 steps read every step of its window: a whole
run of 20k steps at 2000 points was 20k rows grouped and sorted, the costliest query of a
fleet's service. With a level of 8 steps below the 64-step one, a chart reads at most
about four rollup rows a bucket down to 2 steps a bucket, and ``steps`` only at one step a
bucket. The upgrade computes every run's level-6 rows from ``steps`` in one statement
(about the cost of one of the five levels of 394d114978d2: a few seconds per 10M stored
steps, under the store's write lock); the downgrade deletes them. The schema itself does
not change.

The statement is written out here rather than taken from ``scalewatch.store.rollups``: this
revision must keep producing these rows whatever the code says later.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "d4b8f2a6c1e9"
down_revision: str | Sequence[str] | None = "c7d3e9a1b5f2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LEVEL, WIDTH = 6, 8

# Aliases are prefixed: SQLite resolves a bare name in WHERE/GROUP BY to a result alias.
# Rows go in in key order, which is the order of the WITHOUT ROWID b-tree. A NULL loss or
# learning rate is left out of its min and max (SQL's min() and max() do that).
_FROM_STEPS = (
    "INSERT INTO step_rollups (run_id, level, bucket, first_step, last_step, n,"
    " scale_min, scale_max, scale_last, tracker_min, tracker_max, tracker_last,"
    " overflows, skipped, loss_min, loss_max, lr_min, lr_max)"
    " SELECT a.agg_run, {level}, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    " a.agg_scale_min, a.agg_scale_max, s.scale_after,"
    " a.agg_tracker_min, a.agg_tracker_max, s.growth_tracker, a.agg_overflows, a.agg_skipped,"
    " a.agg_loss_min, a.agg_loss_max, a.agg_lr_min, a.agg_lr_max"
    " FROM (SELECT run_id AS agg_run, step / {width} AS agg_bucket, min(step) AS agg_first,"
    " max(step) AS agg_last, count(*) AS agg_n,"
    " {least}(min(scale), min(scale_after)) AS agg_scale_min,"
    " {greatest}(max(scale), max(scale_after)) AS agg_scale_max,"
    " min(growth_tracker) AS agg_tracker_min, max(growth_tracker) AS agg_tracker_max,"
    " sum(CAST(overflow AS INTEGER)) AS agg_overflows,"
    " sum(CAST(skipped AS INTEGER)) AS agg_skipped,"
    " min(loss) AS agg_loss_min, max(loss) AS agg_loss_max,"
    " min(lr) AS agg_lr_min, max(lr) AS agg_lr_max"
    " FROM steps GROUP BY run_id, step / {width}) AS a"
    " JOIN steps AS s ON s.run_id = a.agg_run AND s.step = a.agg_last"
    " ORDER BY a.agg_run, a.agg_bucket"
)


def upgrade() -> None:
    # SQLite's min() and max() of two values are PostgreSQL's LEAST() and GREATEST().
    pair = ("min", "max") if op.get_bind().dialect.name == "sqlite" else ("LEAST", "GREATEST")
    op.execute(_FROM_STEPS.format(level=LEVEL, width=WIDTH, least=pair[0], greatest=pair[1]))


def downgrade() -> None:
    op.execute(f"DELETE FROM step_rollups WHERE level = {LEVEL}")
