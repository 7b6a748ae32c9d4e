"""A family's models in name order: an index on (family, name), bytewise on every backend, so that
`family=timm` (the default sort by name, limit 100) seeks its first rows instead of sorting the family's
250,000 at a million models (SQLite 30-60 ms, PostgreSQL 175-450 ms before; 4 and 8-11 ms with it).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

INDEX = "ix_models_family_name_bytewise"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # the search compares and orders strings COLLATE "C" (zoo.registry.sql.bytewise): an index in that
        # collation, which one in the database's own collation cannot stand in for
        op.execute(f'CREATE INDEX {INDEX} ON models (family COLLATE "C", name COLLATE "C")')
    else:  # SQLite's BINARY collation is bytewise already
        op.create_index(INDEX, "models", ["family", "name"])


def downgrade() -> None:
    op.drop_index(INDEX, "models")
