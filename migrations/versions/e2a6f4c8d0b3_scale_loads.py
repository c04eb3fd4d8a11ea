"""scale_loads: a scaler's state loaded into a run that has steps, and its scale jumps

Revision ID: e2a6f4c8d0b3
Revises: b41e7f2c9d08
Create Date: 2026-12-02 00:00:00.000000

A new table only; no stored row changes. One row per ``load_state_dict`` or
``load_checkpoint`` of a scaler into a run that already has steps: the step the run
continues from, the step it was at, the scale before and after, and ``jump``, whether the
loaded scale differs from the run's last recorded one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e2a6f4c8d0b3"
down_revision: str | Sequence[str] | None = "b41e7f2c9d08"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scale_loads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("from_step", sa.Integer(), nullable=False),
        sa.Column("scale_before", sa.Float(), nullable=False),
        sa.Column("scale_after", sa.Float(), nullable=False),
        sa.Column("jump", sa.Boolean(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_scale_loads_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scale_loads")),
    )
    op.create_index("ix_scale_loads_run_id_step", "scale_loads", ["run_id", "step"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_scale_loads_run_id_step", table_name="scale_loads")
    op.drop_table("scale_loads")
