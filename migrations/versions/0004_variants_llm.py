"""Pretrained variants (published weights, their metrics and preprocessing) and language-model fields.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TEXT = ("weights_source", "preprocess", "card", "metrics", "inputs")  # JSON text
STRINGS = (("arch_name", 255), ("tag", 128), ("license", 64), ("dataset", 128), ("gated", 16))
INTS = (
    "num_classes",
    "weights_bytes",
    "active_params",
    "kv_bytes_per_token",
    "flops_per_token",
    "context_length",
    "sliding_window",
    "layers",
    "hidden_size",
    "heads",
    "kv_heads",
    "vocab_size",
    "experts",
    "experts_per_token",
    "downloads",
    "likes",
    "hub_params",
)
FLOATS = (
    "top1",
    "top5",
    "real_top1",
    "real_top5",
    "v2_top1",
    "v2_top5",
    "sketch_top1",
    "sketch_top5",
    "a_top1",
    "a_top5",
    "r_top1",
    "r_top5",
    "box_map",
    "mask_map",
    "keypoint_map",
    "miou",
    "pixel_acc",
    "k400_top1",
    "k400_top5",
)
INDEXED = ("kind", "arch_name", "license", "top1", "active_params")


def upgrade() -> None:
    # every row so far is an architecture, its own arch_name
    op.add_column("models", sa.Column("kind", sa.String(16), nullable=False, server_default="architecture"))
    for name, size in STRINGS:
        op.add_column("models", sa.Column(name, sa.String(size), nullable=True))
    for name in TEXT:
        op.add_column("models", sa.Column(name, sa.Text, nullable=True))
    for name in INTS:
        op.add_column("models", sa.Column(name, sa.BigInteger, nullable=True))
    for name in FLOATS:
        op.add_column("models", sa.Column(name, sa.Float, nullable=True))
    op.add_column("models", sa.Column("last_modified", sa.DateTime, nullable=True))
    op.execute("UPDATE models SET arch_name = name")
    for name in INDEXED:
        op.create_index(f"ix_models_{name}", "models", [name])


def downgrade() -> None:
    for name in INDEXED:
        op.drop_index(f"ix_models_{name}", "models")
    with op.batch_alter_table("models") as batch:
        for name in ("kind", *(n for n, _ in STRINGS), *TEXT, *INTS, *FLOATS, "last_modified"):
            batch.drop_column(name)
