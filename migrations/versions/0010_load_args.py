"""timm's load_pretrained arguments, caught at index time (zoo.families.timm_loader): a pretrained load replays them
rather than building the model a second time to catch them.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("models", sa.Column("load_args", sa.Text, nullable=True))  # JSON, as the other json columns


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:  # SQLite drops columns by copying the table
        batch.drop_column("load_args")
