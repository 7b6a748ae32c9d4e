"""A name glob's prefix as index ranges (zoo.registry.where.first_ids) also seeks the short name: `name~'vit_*'`
matches timm/vit_base... by its short name. SQLite's index on short (0001) is bytewise already; PostgreSQL's is in
the database's collation, which a bytewise comparison cannot use: each seek read the whole table (80 ms at a
million models). An index on short COLLATE "C" there, as 0005's on name.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SHORT_BYTEWISE = "ix_models_short_bytewise"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f'CREATE INDEX {SHORT_BYTEWISE} ON models (short COLLATE "C")')


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP INDEX {SHORT_BYTEWISE}")
