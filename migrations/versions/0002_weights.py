"""Weights files recorded per model under a tag, with their sha256.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "weights",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("added_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("model_id", "tag"),
    )
    op.create_index("ix_weights_model_id", "weights", ["model_id"])


def downgrade() -> None:
    op.drop_table("weights")
