"""Throughput measured by `zoo bench`: one row per run, with the hardware, the mode, the result, and who measured
it when with which versions (zoo.registry.tables.Measurement). The index serves the measured search fields
(zoo.throughput.measured: `bench_cpu>100` is an EXISTS over a model's rows of one device and mode) and `zoo show`.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
        sa.Column("hardware", sa.String(255), nullable=False),
        sa.Column("device", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("compiled", sa.Boolean, nullable=False),
        sa.Column("channels_last", sa.Boolean, nullable=False),
        sa.Column("threads", sa.Integer, nullable=False),
        sa.Column("inputs", sa.Text, nullable=False),
        sa.Column("samples_per_s", sa.Float, nullable=False),
        sa.Column("step_ms", sa.Float, nullable=False),
        sa.Column("peak_bytes", sa.BigInteger, nullable=True),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("warmup", sa.Integer, nullable=False),
        sa.Column("versions", sa.Text, nullable=False),
        sa.Column("who", sa.String(255), nullable=False),
        sa.Column("measured_at", sa.DateTime, nullable=False),
    )
    op.create_index(
        "ix_measurements_model_device_mode", "measurements", ["model_id", "device", "mode", "samples_per_s"]
    )


def downgrade() -> None:
    op.drop_table("measurements")
