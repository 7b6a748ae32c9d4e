"""The registry: tables, engines, queries, search SQL, copy."""

# The alembic head this code reads and writes (zoo.registry.db.SCHEMA_REVISION; a test checks it equals the
# migrations' head). Here, so that the read-only search (zoo.registry.lite) knows it without SQLAlchemy.
SCHEMA_REVISION = "0010"
