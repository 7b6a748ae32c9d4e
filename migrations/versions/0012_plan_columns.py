"""What zoo.plan and `zoo search --fits` read without building a model: plan_shapes (parameters grouped by shape)
and plan_activations (fitted activation regimes per mode), both recorded by zoo index.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

COLUMNS = ("plan_shapes", "plan_activations")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("models", sa.Column(name, sa.Text, nullable=True))  # JSON, as the other json columns


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:  # SQLite drops columns by copying the table
        for name in COLUMNS:
            batch.drop_column(name)
