"""Overflow diagnosis: the loss of each step, and the parameters of each overflow

Revision ID: 7c25d1a9e5f0
Revises: 394d114978d2
Create Date: 2025-01-04 00:00:00.000000

``steps`` gains the reporting rank's ``loss`` (NULL when unseen or not finite), the ranks
whose loss was not finite (``loss_nonfinite_ranks``, ``"1,3"`` like ``inf_ranks``) and the
count of non-finite parameters found but not kept (``params_omitted``); ``step_rollups``
gains the min and max of each bucket's finite losses. Stored steps have no loss, so the
new rollup columns start NULL, which is what they would be computed as: nothing is
rebuilt. The new table ``overflow_params`` holds, per overflow step and rank, the
parameters whose local gradients held inf or NaN.

Columns are added with ``ALTER TABLE ... ADD COLUMN`` on both backends (SQLite's batch mode
adds them in place). The downgrade drops them in place too (SQLite 3.35 or later): a
rebuild of ``steps`` by batch mode would need to keep WITHOUT ROWID and the partial
``ix_steps_overflow``, which reflection does not carry over.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7c25d1a9e5f0"
down_revision: str | Sequence[str] | None = "394d114978d2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("loss", sa.Float(), nullable=True))
        batch.add_column(
            sa.Column("loss_nonfinite_ranks", sa.String(), nullable=False, server_default="")
        )
        batch.add_column(
            sa.Column("params_omitted", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("step_rollups") as batch:
        batch.add_column(sa.Column("loss_min", sa.Float(), nullable=True))
        batch.add_column(sa.Column("loss_max", sa.Float(), nullable=True))
    op.create_table(
        "overflow_params",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(500), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_overflow_params_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "rank", "name", name="pk_overflow_params"),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("overflow_params")
    with op.batch_alter_table("step_rollups", recreate="never") as batch:
        batch.drop_column("loss_max")
        batch.drop_column("loss_min")
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.drop_column("params_omitted")
        batch.drop_column("loss_nonfinite_ranks")
        batch.drop_column("loss")
