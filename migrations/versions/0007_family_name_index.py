"""Search at a million rows, more shapes: a family's models in name order, and a range sorted by another
number read from its index alone.

- (family, name), bytewise on every backend: `family=timm` (the default sort by name, limit 100) seeks its
  first rows instead of sorting the family's 250,000 at a million models (SQLite 30-63 ms, PostgreSQL
  175-450 ms; with it 3.5 and 6.1 ms, bench/search_1m.py).
- The range indexes of 0005, (params, name), (bytes, name) and (flops, name), carry the other numbers a
  search sorts by (params, bytes, flops, top1; PostgreSQL also the id): `params>1e9 and params<2e9` sorted
  by -flops reads the 43,000 matches' sort keys from the index instead of 28,000 table pages
  (PostgreSQL 108 -> 21 ms).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

FAMILY_NAME = "ix_models_family_name_bytewise"
CARRIED = ("params", "bytes", "flops", "top1")
COVERING = {
    f"ix_models_{field}_name": [field, "name", *(c for c in CARRIED if c != field)]
    for field in ("params", "bytes", "flops")
}  # 0005's names, its leading columns


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # the search compares and orders strings COLLATE "C" (zoo.registry.sql.bytewise): an index in that
        # collation, which one in the database's own collation cannot stand in for
        op.execute(f'CREATE INDEX {FAMILY_NAME} ON models (family COLLATE "C", name COLLATE "C")')
    else:  # SQLite's BINARY collation is bytewise already
        op.create_index(FAMILY_NAME, "models", ["family", "name"])
    for name, columns in COVERING.items():
        op.drop_index(name, "models")
        # SQLite's indexes hold the rowid (the id) already; PostgreSQL's index-only scan needs it included
        op.create_index(name, "models", columns, postgresql_include=["id"])


def downgrade() -> None:
    for name, columns in COVERING.items():
        op.drop_index(name, "models")
        op.create_index(name, "models", columns[:2])
    op.drop_index(FAMILY_NAME, "models")
