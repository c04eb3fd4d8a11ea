"""runs.step_rewrites: a count of the writes that replaced stored steps

Revision ID: c2e8a4f6d0b9
Revises: a9d2e4f6b8c1
Create Date: 2026-12-07 18:30:00.000000

A write of steps at or below a run's last one (a retried batch, steps replayed after a
resume from an older checkpoint) adds one to ``runs.step_rewrites`` in its transaction;
a write of newer steps alone leaves it. A reader that kept buckets of steps it read (the
service's chart cache) knows from it whether they may have changed. Stored runs start at 0:
nothing was cached before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c2e8a4f6d0b9"
down_revision: str | Sequence[str] | None = "a9d2e4f6b8c1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.add_column(
            sa.Column("step_rewrites", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.drop_column("step_rewrites")
