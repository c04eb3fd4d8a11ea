"""steps and step_rollups as WITHOUT ROWID tables, clustered on their primary keys

Revision ID: 4bfa51145dc1
Revises: e3f1a9c07b42
Create Date: 2025-01-02 00:00:00.000000

A chart range or an export page then reads one b-tree in key order instead of the
primary-key index plus a table lookup per row. Each table is rebuilt (create, copy in key
order, drop, rename); ``ix_steps_overflow`` is created again on the new ``steps``.
PostgreSQL has no WITHOUT ROWID tables: there the revision changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "4bfa51145dc1"
down_revision: str | Sequence[str] | None = "e3f1a9c07b42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STEPS_COLUMNS = (
    "run_id, step, wall_time, scale, overflow, skipped, inf_ranks, scale_after,"
    " growth_tracker, growth_interval, growth_factor, backoff_factor, control_version"
)
_ROLLUP_COLUMNS = (
    "run_id, level, bucket, first_step, last_step, n, scale_min, scale_max, scale_last,"
    " tracker_min, tracker_max, tracker_last, overflows, skipped"
)


def _create_steps(name: str, *, with_rowid: bool) -> None:
    op.create_table(
        name,
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("wall_time", sa.Float(), nullable=False),
        sa.Column("scale", sa.Float(), nullable=False),
        sa.Column("overflow", sa.Boolean(), nullable=False),
        sa.Column("skipped", sa.Boolean(), nullable=False),
        sa.Column("inf_ranks", sa.String(), nullable=False),
        sa.Column("scale_after", sa.Float(), nullable=False),
        sa.Column("growth_tracker", sa.Integer(), nullable=False),
        sa.Column("growth_interval", sa.Integer(), nullable=False),
        sa.Column("growth_factor", sa.Float(), nullable=False),
        sa.Column("backoff_factor", sa.Float(), nullable=False),
        sa.Column("control_version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_steps_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", name="pk_steps"),
        sqlite_with_rowid=with_rowid,
    )


def _create_rollups(name: str, *, with_rowid: bool) -> None:
    op.create_table(
        name,
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("scale_min", sa.Float(), nullable=False),
        sa.Column("scale_max", sa.Float(), nullable=False),
        sa.Column("scale_last", sa.Float(), nullable=False),
        sa.Column("tracker_min", sa.Integer(), nullable=False),
        sa.Column("tracker_max", sa.Integer(), nullable=False),
        sa.Column("tracker_last", sa.Integer(), nullable=False),
        sa.Column("overflows", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_step_rollups_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "level", "bucket", name="pk_step_rollups"),
        sqlite_with_rowid=with_rowid,
    )


def _rebuild(*, with_rowid: bool) -> None:
    _create_steps("_steps_new", with_rowid=with_rowid)
    op.execute(
        f"INSERT INTO _steps_new ({_STEPS_COLUMNS})"
        f" SELECT {_STEPS_COLUMNS} FROM steps ORDER BY run_id, step"
    )
    op.drop_index("ix_steps_overflow", table_name="steps")
    op.drop_table("steps")
    op.rename_table("_steps_new", "steps")
    op.create_index(
        "ix_steps_overflow", "steps", ["run_id", "step"], sqlite_where=sa.text("overflow")
    )

    _create_rollups("_step_rollups_new", with_rowid=with_rowid)
    op.execute(
        f"INSERT INTO _step_rollups_new ({_ROLLUP_COLUMNS})"
        f" SELECT {_ROLLUP_COLUMNS} FROM step_rollups ORDER BY run_id, level, bucket"
    )
    op.drop_table("step_rollups")
    op.rename_table("_step_rollups_new", "step_rollups")


def _on_sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def upgrade() -> None:
    if _on_sqlite():
        _rebuild(with_rowid=False)


def downgrade() -> None:
    if _on_sqlite():
        _rebuild(with_rowid=True)
