"""runs.owner and runs.batch_sequence: runs a job records through the service

Revision ID: f5a7c3e9b1d4
Revises: d4b8f2a6c1e9
Create Date: 2026-12-06 00:00:00.000000

Two columns of ``runs``; no stored row changes. ``owner``: the identity whose token created
the run through the service's ingest routes (a writer records into the runs it created
alone); null for a run a trainer wrote into the store itself. ``batch_sequence``: the last
batch of the run the service stored, so that a batch sent again stores nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f5a7c3e9b1d4"
down_revision: str | Sequence[str] | None = "d4b8f2a6c1e9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.add_column(sa.Column("owner", sa.String(200), nullable=True))
        batch.add_column(
            sa.Column("batch_sequence", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.drop_column("batch_sequence")
        batch.drop_column("owner")
