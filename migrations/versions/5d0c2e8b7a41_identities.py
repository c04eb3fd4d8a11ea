"""identities and identity_events: named users of the service, with roles

Revision ID: 5d0c2e8b7a41
Revises: 073a2251585d
Create Date: 2026-12-02 00:00:00.000000

New tables only. A token is never stored: ``key`` is its public part (how a presented
token finds its row), ``token_hash`` the salted SHA-256 of its secret part.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5d0c2e8b7a41"
down_revision: str | Sequence[str] | None = "073a2251585d"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "identities",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=32), nullable=True),
        sa.Column("salt", sa.String(length=32), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_identities")),
        sa.UniqueConstraint("name", name=op.f("uq_identities_name")),
        sa.UniqueConstraint("key", name=op.f("uq_identities_key")),
    )
    op.create_table(
        "identity_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("by", sa.String(length=200), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_identity_events")),
    )


def downgrade() -> None:
    op.drop_table("identity_events")
    op.drop_table("identities")
