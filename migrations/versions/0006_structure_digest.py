"""A digest of each build's structure and analysis input (zoo.structure), so that a build identical to one
already analysed (a pretrained variant that builds its architecture unchanged) reuses that analysis.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("structure_digest", sa.String(64), nullable=True))  # rows so far: none
    op.create_index("ix_models_structure_digest", "models", ["structure_digest"])


def downgrade() -> None:
    op.drop_index("ix_models_structure_digest", "models")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("structure_digest")
