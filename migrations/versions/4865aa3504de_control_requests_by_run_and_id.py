"""an index on control_requests (run_id, id): a run's audit trail read a page at a time

Revision ID: 4865aa3504de
Revises: 7c25d1a9e5f0
Create Date: 2026-12-01 00:00:00.000000

``GET /api/runs/{run}/control`` pages the audit trail by keyset (the newest requests
before a request id). With the index a page reads its rows in key order, however long
the run's history; without it both backends read every request of the run and sort them.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "4865aa3504de"
down_revision: str | Sequence[str] | None = "7c25d1a9e5f0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_control_requests_run_id", "control_requests", ["run_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_control_requests_run_id", table_name="control_requests")
