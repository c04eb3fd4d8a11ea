"""The learning rate of each step

Revision ID: b41e7f2c9d08
Revises: 5d0c2e8b7a41
Create Date: 2026-12-02 00:00:00.000000

``steps`` gains ``lr``, the learning rate in effect at the step (the first param group of
the first optimizer stepped; NULL when not known) and ``lr_groups``, the learning rates of
every param group of every optimizer stepped, as JSON (``[[0.001, 0.0005], [0.01]]``), only
when one differs from ``lr`` (NULL otherwise). ``step_rollups`` gains the min and max of
each bucket's learning rates. Stored steps have no learning rate, so the new rollup
columns start NULL, which is what they would be computed as: nothing is rebuilt.

Added and dropped in place, as in 7c25d1a9e5f0 (which says why).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b41e7f2c9d08"
down_revision: str | Sequence[str] | None = "5d0c2e8b7a41"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("lr", sa.Float(), nullable=True))
        batch.add_column(sa.Column("lr_groups", sa.String(), nullable=True))
    with op.batch_alter_table("step_rollups") as batch:
        batch.add_column(sa.Column("lr_min", sa.Float(), nullable=True))
        batch.add_column(sa.Column("lr_max", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_rollups", recreate="never") as batch:
        batch.drop_column("lr_max")
        batch.drop_column("lr_min")
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.drop_column("lr_groups")
        batch.drop_column("lr")
