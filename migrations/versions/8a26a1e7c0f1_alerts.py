"""alerts: what the service's rules raised on a run, fired once and resolved once

Revision ID: 8a26a1e7c0f1
Revises: 9b26a0709170
Create Date: 2025-01-04 00:00:00.000000

A new table only; no stored row changes. ``uq_alerts_firing`` (partial: firing rows only)
keeps one firing alert per run and rule, also when two services evaluate one store.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8a26a1e7c0f1"
down_revision: str | Sequence[str] | None = "9b26a0709170"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("detail", sa.String(length=200), nullable=False),
        sa.Column("fired_step", sa.Integer(), nullable=False),
        sa.Column("fired_at", sa.Float(), nullable=False),
        sa.Column("resolved_step", sa.Integer(), nullable=True),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.Column("resolved_value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_alerts_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index("ix_alerts_run_id_state", "alerts", ["run_id", "state"], unique=False)
    op.create_index(
        "uq_alerts_firing",
        "alerts",
        ["run_id", "rule"],
        unique=True,
        sqlite_where=sa.text("state = 'firing'"),
        postgresql_where=sa.text("state = 'firing'"),
    )


def downgrade() -> None:
    op.drop_index("uq_alerts_firing", table_name="alerts")
    op.drop_index("ix_alerts_run_id_state", table_name="alerts")
    op.drop_table("alerts")
