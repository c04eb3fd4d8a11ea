"""autopilots: the per-run settings, state and last decision of the service's autopilot

Revision ID: 9b26a0709170
Revises: 394d114978d2
Create Date: 2025-01-04 00:00:00.000000

A new table only; control_requests.source (String(16)) takes the new value "autopilot"
as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9b26a0709170"
down_revision: str | Sequence[str] | None = "394d114978d2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autopilots",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("target_skip_rate", sa.Float(), nullable=False),
        sa.Column("min_growth_interval", sa.Integer(), nullable=False),
        sa.Column("max_growth_interval", sa.Integer(), nullable=False),
        sa.Column("min_scale", sa.Float(), nullable=True),
        sa.Column("cooldown_steps", sa.Integer(), nullable=False),
        sa.Column("max_changes_per_hour", sa.Integer(), nullable=False),
        sa.Column("misses", sa.Integer(), nullable=False),
        sa.Column("helped_below", sa.Float(), nullable=True),
        sa.Column("decision", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_autopilots_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_autopilots")),
    )


def downgrade() -> None:
    op.drop_table("autopilots")
