"""Steps skipped for a spike

Revision ID: a9d2e4f6b8c1
Revises: f5a3c9e1d7b2
Create Date: 2026-12-07 02:00:00.000000

``steps`` gains ``spike_skipped``: the step skipped its optimizers for a spike of its loss
or gradient norm (``skip_on_spike``), not for an overflow (false for the steps stored
before, none of which could be); ``step_rollups`` gains each bucket's count of them,
``spike_skips``, which starts 0 as it would be computed: nothing is rebuilt.

Added and dropped in place, as in 7c25d1a9e5f0 (which says why).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a9d2e4f6b8c1"
down_revision: str | Sequence[str] | None = "f5a3c9e1d7b2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(
            sa.Column("spike_skipped", sa.Boolean(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("step_rollups") as batch:
        batch.add_column(sa.Column("spike_skips", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("step_rollups", recreate="never") as batch:
        batch.drop_column("spike_skips")
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.drop_column("spike_skipped")
