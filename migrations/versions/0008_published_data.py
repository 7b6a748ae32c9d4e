"""Published data at the row's own size: the test-size result and its cost, the pretraining data, and timm's
measured throughput per hardware and mode (zoo.columns says what each holds).

- `top1`, `top5`, ... of a timm variant are its result at `input_size`; a tag timm also evaluated at its larger
  test size keeps that result in `test_top1`/`test_top5` with `test_input_size`, and `test_flops` is the cost
  measured on meta at that size.
- Throughput columns are named MODE_HARDWARE_PRECISION (samples/s) with a `_batch` twin (the batch size it was
  measured at); hardware added later is one more pair of columns.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

THROUGHPUT = ("infer_4090_amp", "infer_5090_amp", "infer_pro6000_amp", "infer_i7_12700h_fp32", "train_3090_amp")
COLUMNS = (
    ("test_top1", sa.Float),
    ("test_top5", sa.Float),
    ("test_input_size", sa.String(64)),  # JSON list, as input_size
    ("test_flops", sa.BigInteger),
    ("pretrain", sa.String(64)),
    *((name, sa.Float) for name in THROUGHPUT),
    *((f"{name}_batch", sa.Integer) for name in THROUGHPUT),
)


def upgrade() -> None:
    for name, kind in COLUMNS:  # ADD COLUMN: no table copy, even on SQLite
        op.add_column("models", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:  # SQLite drops columns by copying the table
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
