"""The gradient norm of each step, the largest parameter norms, and spikes

Revision ID: f5a3c9e1d7b2
Revises: f5a7c3e9b1d4
Create Date: 2026-12-06 05:30:00.000000

``steps`` gains ``grad_norm``, the total L2 norm of the step's unscaled gradients (NULL
when it was neither measured nor handed in, or not finite, as for every step stored
before) and the spike flags ``loss_spike`` and ``grad_norm_spike`` (false for the steps
stored before); ``step_rollups`` gains the min and max of each bucket's norms and its count
of each kind of spike. Stored steps have no norm and no spike, so the new rollup columns
start NULL and 0, which is what they would be computed as: nothing is rebuilt.
``param_norms`` holds the ten largest per-parameter norms of a step that overflowed or
spiked; ``spikes`` the steps whose loss or gradient norm spiked.

Added and dropped in place, as in 7c25d1a9e5f0 (which says why).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f5a3c9e1d7b2"
down_revision: str | Sequence[str] | None = "f5a7c3e9b1d4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("grad_norm", sa.Float(), nullable=True))
        for flag in ("loss_spike", "grad_norm_spike"):
            batch.add_column(sa.Column(flag, sa.Boolean(), nullable=False, server_default="0"))
    with op.batch_alter_table("step_rollups") as batch:
        batch.add_column(sa.Column("grad_norm_min", sa.Float(), nullable=True))
        batch.add_column(sa.Column("grad_norm_max", sa.Float(), nullable=True))
        for count in ("loss_spikes", "grad_norm_spikes"):
            batch.add_column(sa.Column(count, sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "param_norms",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(500), nullable=False),
        sa.Column("norm", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_param_norms_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "position", name="pk_param_norms"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "spikes",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("what", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("z", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_spikes_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "what", name="pk_spikes"),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("spikes")
    op.drop_table("param_norms")
    with op.batch_alter_table("step_rollups", recreate="never") as batch:
        batch.drop_column("grad_norm_spikes")
        batch.drop_column("loss_spikes")
        batch.drop_column("grad_norm_max")
        batch.drop_column("grad_norm_min")
    with op.batch_alter_table("steps", recreate="never") as batch:
        batch.drop_column("grad_norm_spike")
        batch.drop_column("loss_spike")
        batch.drop_column("grad_norm")
