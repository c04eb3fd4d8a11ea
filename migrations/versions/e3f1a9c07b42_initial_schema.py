"""initial schema: runs, steps, step_rollups, control_requests, telemetry_gaps

Revision ID: e3f1a9c07b42
Revises:
Create Date: 2025-01-01 00:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e3f1a9c07b42"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("uid", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("control", sa.JSON(), nullable=False),
        sa.Column("control_version", sa.Integer(), nullable=False),
        sa.Column("torch_version", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("dropped", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("uid", name=op.f("uq_runs_uid")),
    )
    op.create_table(
        "steps",
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
            ["run_id"], ["runs.id"], name=op.f("fk_steps_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_steps")),
    )
    op.create_index(
        "ix_steps_overflow",
        "steps",
        ["run_id", "step"],
        unique=False,
        sqlite_where=sa.text("overflow"),
        postgresql_where=sa.text("overflow"),
    )
    op.create_table(
        "step_rollups",
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
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_step_rollups_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "level", "bucket", name=op.f("pk_step_rollups")),
    )
    op.create_table(
        "control_requests",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("requested_at", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("applied_step", sa.Integer(), nullable=True),
        sa.Column("applied_at", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_control_requests_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_control_requests")),
    )
    op.create_index(
        "ix_control_requests_run_status",
        "control_requests",
        ["run_id", "status"],
        unique=False,
    )
    op.create_table(
        "telemetry_gaps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("dropped", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_telemetry_gaps_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_telemetry_gaps")),
    )


def downgrade() -> None:
    op.drop_table("telemetry_gaps")
    op.drop_index("ix_control_requests_run_status", table_name="control_requests")
    op.drop_table("control_requests")
    op.drop_table("step_rollups")
    op.drop_index("ix_steps_overflow", table_name="steps")
    op.drop_table("steps")
    op.drop_table("runs")
