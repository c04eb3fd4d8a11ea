"""control_requests.note: why a change was asked for, kept when the request is rejected

Revision ID: 073a2251585d
Revises: 4865aa3504de
Create Date: 2026-12-01 00:00:00.000000

The autopilot's reason for a change was stored in ``reason``, which a rejection (by the
reporting rank, or the run ending first) then overwrote with why it was refused: the
audit trail lost why the change was asked for. ``note`` holds the requester's why;
``reason`` is only ever why it was rejected. The autopilot's requests that are not
rejected move their reason to ``note``; a rejected one's was overwritten already.

The downgrade puts a note back in ``reason`` where no rejection took its place, and
drops the column in place (SQLite 3.35 or later), as the upgrade adds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "073a2251585d"
down_revision: str | Sequence[str] | None = "4865aa3504de"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("control_requests", recreate="never") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))
    op.execute(
        "UPDATE control_requests SET note = reason, reason = NULL"
        " WHERE source = 'autopilot' AND status <> 'rejected'"
    )


def downgrade() -> None:
    op.execute("UPDATE control_requests SET reason = note WHERE reason IS NULL")
    with op.batch_alter_table("control_requests", recreate="never") as batch:
        batch.drop_column("note")
