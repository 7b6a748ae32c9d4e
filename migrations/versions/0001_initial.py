"""Initial schema: models and their compressed tensor tables.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        sa.Column("short", sa.String(255), nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("builder", sa.String(255), nullable=False),
        sa.Column("kwargs", sa.Text, nullable=False),
        sa.Column("arch", sa.String(255)),
        sa.Column("task", sa.String(64)),
        sa.Column("input_size", sa.String(64)),
        sa.Column("versions", sa.Text, nullable=False),
        sa.Column("dtype", sa.String(32)),
        sa.Column("params", sa.BigInteger),
        sa.Column("trainable", sa.BigInteger),
        sa.Column("buffers", sa.BigInteger),
        sa.Column("tensors", sa.Integer),
        sa.Column("param_bytes", sa.BigInteger),
        sa.Column("buffer_bytes", sa.BigInteger),
        sa.Column("bytes", sa.BigInteger),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("indexed_at", sa.DateTime, nullable=False),
    )
    for column in ("short", "family", "arch", "task", "params", "bytes", "status"):
        op.create_index(f"ix_models_{column}", "models", [column])
    op.create_index("ix_models_family_params", "models", ["family", "params"])
    op.create_table(
        "model_tensors",
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("model_tensors")
    op.drop_table("models")
