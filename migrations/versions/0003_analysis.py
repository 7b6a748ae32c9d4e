"""Analysis columns on models: FLOPs, MACs, activation bytes and output shapes from a meta forward.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

COLUMNS = (
    ("flops", sa.BigInteger),  # batch 1, inference, FlopCounterMode (2 per multiply-accumulate)
    ("macs", sa.BigInteger),
    ("train_activation_bytes", sa.BigInteger),  # saved for backward, training mode
    ("peak_activation_bytes", sa.BigInteger),  # peak of live activations, inference
    ("output_shapes", sa.Text),  # JSON [[path, shape, dtype], ...]
    ("scan_status", sa.String(16)),  # "ok", "error", "no-input"; NULL: not analysed (rows indexed before 0003)
    ("scan_error", sa.Text),
)


def upgrade() -> None:
    for name, kind in COLUMNS:  # ADD COLUMN: no table copy, even on SQLite
        op.add_column("models", sa.Column(name, kind, nullable=True))
    op.create_index("ix_models_flops", "models", ["flops"])


def downgrade() -> None:
    op.drop_index("ix_models_flops", "models")
    with op.batch_alter_table("models") as batch:  # SQLite drops columns by copying the table
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
