"""step_rollups gain sealed levels 2 and 4 times each level: 16, 32, 128, ... steps

Revision ID: b7e3c1f9a5d2
Revises: a9d2e4f6b8c1
Create Date: 2026-12-07 16:00:00.000000

A chart's buckets are 1 to 4 times as wide as a rollup level (``charts._bucket_width``): a
whole run of 26k steps at 2000 points is 1,626 buckets of 16 steps, each grouped from two
8-step rows, and the 18 aggregates over those rows were most of the chart's cost. Levels 7
to 16, 2 and 4 times each level, make a bucket 2 or 4 times a level's width one stored row
(3 times: still three rows grouped); the widths charts choose do not change. They keep
only the buckets that are over (their last step at or before the run's last step), so a
batch of new steps writes a row of theirs only when it takes the run past a bucket. The
upgrade builds them from their parent levels for the buckets over (a few seconds per 10M
stored steps); the downgrade deletes them. The schema itself does not change.

Written out here rather than taken from ``scalewatch.store.rollups``, as d4b8f2a6c1e9 is:
this revision must keep producing these rows whatever the code says later.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "b7e3c1f9a5d2"
down_revision: str | Sequence[str] | None = "a9d2e4f6b8c1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# level: (width, the level it is merged from, that level's width).
NEW_LEVELS: dict[int, tuple[int, int, int]] = {
    7: (16, 6, 8),
    8: (32, 6, 8),
    9: (128, 1, 64),
    10: (256, 1, 64),
    11: (1024, 2, 512),
    12: (2048, 2, 512),
    13: (8192, 3, 4096),
    14: (16384, 3, 4096),
    15: (65536, 4, 32768),
    16: (131072, 4, 32768),
}

# Aliases are prefixed: SQLite resolves a bare name in WHERE/GROUP BY to a result alias.
# The last values are the parent row's of the bucket's last step. A NULL loss, learning
# rate or gradient norm is left out of its min and max (SQL's min() and max() do that).
# Rows go in in key order, the order of the WITHOUT ROWID b-tree.
_FROM_PARENT = (
    "INSERT INTO step_rollups (run_id, level, bucket, first_step, last_step, n,"
    " scale_min, scale_max, scale_last, overflows, skipped,"
    " tracker_min, tracker_max, tracker_last, loss_min, loss_max, lr_min, lr_max,"
    " grad_norm_min, grad_norm_max, loss_spikes, grad_norm_spikes, spike_skips)"
    " SELECT a.agg_run, {level}, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    " a.agg_scale_min, a.agg_scale_max, c.scale_last, a.agg_overflows, a.agg_skipped,"
    " a.agg_tracker_min, a.agg_tracker_max, c.tracker_last,"
    " a.agg_loss_min, a.agg_loss_max, a.agg_lr_min, a.agg_lr_max,"
    " a.agg_grad_norm_min, a.agg_grad_norm_max,"
    " a.agg_loss_spikes, a.agg_grad_norm_spikes, a.agg_spike_skips"
    " FROM (SELECT run_id AS agg_run, bucket / {ratio} AS agg_bucket,"
    " min(first_step) AS agg_first, max(last_step) AS agg_last, sum(n) AS agg_n,"
    " min(scale_min) AS agg_scale_min, max(scale_max) AS agg_scale_max,"
    " sum(overflows) AS agg_overflows, sum(skipped) AS agg_skipped,"
    " min(tracker_min) AS agg_tracker_min, max(tracker_max) AS agg_tracker_max,"
    " min(loss_min) AS agg_loss_min, max(loss_max) AS agg_loss_max,"
    " min(lr_min) AS agg_lr_min, max(lr_max) AS agg_lr_max,"
    " min(grad_norm_min) AS agg_grad_norm_min, max(grad_norm_max) AS agg_grad_norm_max,"
    " sum(loss_spikes) AS agg_loss_spikes, sum(grad_norm_spikes) AS agg_grad_norm_spikes,"
    " sum(spike_skips) AS agg_spike_skips"
    " FROM step_rollups WHERE level = {parent} GROUP BY run_id, bucket / {ratio}) AS a"
    " JOIN runs AS r ON r.id = a.agg_run"
    " JOIN step_rollups AS c ON c.run_id = a.agg_run AND c.level = {parent}"
    " AND c.bucket = a.agg_last / {parent_width}"
    " WHERE (a.agg_bucket + 1) * {width} - 1 <= r.last_step"
    " ORDER BY a.agg_run, a.agg_bucket"
)


def upgrade() -> None:
    for level, (width, parent, parent_width) in NEW_LEVELS.items():
        op.execute(
            _FROM_PARENT.format(
                level=level,
                width=width,
                parent=parent,
                parent_width=parent_width,
                ratio=width // parent_width,
            )
        )


def downgrade() -> None:
    op.execute(f"DELETE FROM step_rollups WHERE level IN ({', '.join(map(str, NEW_LEVELS))})")
