"""The gradient norm of each step

Revision ID: f5a3c9e1d7b2
Revises: d4b8f2a6c1e9
Create Date: 2026-12-06 05:30:00.000000

``steps`` gains ``grad_norm``: the total L2 norm of the step's unscaled gradients (NULL
when it was neither measured nor handed in, or not finite, as for every step stored
before); ``step_rollups`` gains the min and max of each bucket's norms. Stored steps have
no norm, so the new rollup columns start NULL, which is what they would be computed as:
nothing is rebuilt.

Added and dropped in place, as in 7c25d1a9e5f0 (which says why).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f5a3c9e1d7b2"
down_revision: str | Sequence[str] | None = "d4b8f2a6c1e9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("grad_norm", sa.Float(), nullable=True))
    with op.batch_alter_table("step_rollups") as batch:
        batch.add_column(sa.Column("grad_norm_min", sa.Float(), nullable=True))
        batch.add_column(sa.Column("grad_norm_max", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_rollups", recreate="never") as batch:
        batch.drop_column("grad_norm_max")
        batch.drop_column("grad_norm_min")
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.drop_column("grad_norm")
