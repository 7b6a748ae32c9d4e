"""Search at a million rows: composite indexes that cover a range and the default order by name, and a
trigram index for name globs (SQLite: an FTS5 trigram table kept in sync by triggers; PostgreSQL: pg_trgm
GIN, and a bytewise name index for the bytewise ORDER BY).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# (name, columns): a range on the first columns, read in name order without touching the table
COMPOSITE = (
    ("ix_models_params_name", ["params", "name"]),
    ("ix_models_bytes_name", ["bytes", "name"]),
    ("ix_models_flops_name", ["flops", "name"]),
    ("ix_models_family_params_name", ["family", "params", "name"]),
)

# SQLite: an external-content FTS5 table over models.name (no copy of the names), trigram-tokenized, so that
# LIKE '%vit%' finds candidate rows through the index; triggers keep it in step with every write path (the ORM,
# db copy, a raw INSERT). Case-insensitive trigrams fold a superset of what the search folds (ASCII only): the
# search uses it as a pre-filter and still applies its own LIKE (zoo.registry.sql).
SQLITE_UP = [
    "CREATE VIRTUAL TABLE models_fts USING fts5(name, content='models', content_rowid='id', tokenize='trigram')",
    "INSERT INTO models_fts(models_fts) VALUES ('rebuild')",
    "CREATE TRIGGER models_fts_insert AFTER INSERT ON models BEGIN "
    "INSERT INTO models_fts(rowid, name) VALUES (new.id, new.name); END",
    "CREATE TRIGGER models_fts_delete AFTER DELETE ON models BEGIN "
    "INSERT INTO models_fts(models_fts, rowid, name) VALUES ('delete', old.id, old.name); END",
    "CREATE TRIGGER models_fts_update AFTER UPDATE OF id, name ON models BEGIN "
    "INSERT INTO models_fts(models_fts, rowid, name) VALUES ('delete', old.id, old.name); "
    "INSERT INTO models_fts(rowid, name) VALUES (new.id, new.name); END",
]
# A later migration that rebuilds the models table (alembic batch mode on SQLite copies it) drops these
# triggers with the old table: it must create them again.
SQLITE_DOWN = [
    "DROP TRIGGER models_fts_update",
    "DROP TRIGGER models_fts_delete",
    "DROP TRIGGER models_fts_insert",
    "DROP TABLE models_fts",
]


def upgrade() -> None:
    op.drop_index("ix_models_family_params", "models")
    for name, columns in COMPOSITE:
        op.create_index(name, "models", columns)
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for statement in SQLITE_UP:
            op.execute(statement)
    elif dialect == "postgresql":
        # the search orders by name COLLATE "C" (bytewise on every backend): an index in that collation
        op.execute('CREATE INDEX ix_models_name_bytewise ON models (name COLLATE "C")')
        # pg_trgm ships with the server (postgresql-contrib, in Debian's postgresql package) and is a trusted
        # extension: a database owner may create it. Where a server lacks it, globs still work, unindexed.
        available = (
            op.get_bind().exec_driver_sql("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'").first()
        )
        if available:
            op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            # short too: a glob that does not start with * also matches the short name (name OR short)
            for column in ("name", "short"):
                op.execute(
                    f'CREATE INDEX ix_models_{column}_trgm ON models USING gin ({column} COLLATE "C" gin_trgm_ops)'
                )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for statement in SQLITE_DOWN:
            op.execute(statement)
    elif dialect == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_models_name_trgm")
        op.execute("DROP INDEX IF EXISTS ix_models_short_trgm")
        op.execute("DROP INDEX ix_models_name_bytewise")
    for name, _ in COMPOSITE:
        op.drop_index(name, "models")
    op.create_index("ix_models_family_params", "models", ["family", "params"])
