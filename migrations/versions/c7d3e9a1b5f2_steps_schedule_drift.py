"""The schedule's drift of each step

Revision ID: c7d3e9a1b5f2
Revises: e2a6f4c8d0b3
Create Date: 2026-12-02 17:00:00.000000

``steps`` gains ``schedule_drift``: the skipped steps so far on which a registered LR
scheduler stepped, how far the schedule runs ahead of the weights (NULL when no scheduler
is registered, as for every step stored before). ``step_rollups`` gains nothing: the count
only grows, so a bucket's value is its last step's, which the series reads from ``steps``
already (as it reads the last scale and loss).

Added and dropped in place, as in 7c25d1a9e5f0 (which says why).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c7d3e9a1b5f2"
down_revision: str | Sequence[str] | None = "e2a6f4c8d0b3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("schedule_drift", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.drop_column("schedule_drift")
