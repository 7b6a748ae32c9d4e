"""The registry: tables, engines, queries, search SQL, copy. Here, what both readers share without SQLAlchemy:
the schema revision and what a database error means."""

# The alembic head this code reads and writes (zoo.registry.db.SCHEMA_REVISION; a test checks it equals the
# migrations' head). Here, so that the read-only search (zoo.registry.lite) knows it without SQLAlchemy.
SCHEMA_REVISION = "0012"

# Driver messages -> what they mean for a registry and what to do.
MEANINGS = (
    (
        "file is not a database",
        "is not a SQLite database: point --registry (or ZOO_REGISTRY) at a registry file, "
        "or create one with `zoo db upgrade`",
    ),
    (
        "unable to open database file",
        "cannot be opened (a directory, or a folder that does not exist?): give the path of a registry file",
    ),
    (
        "readonly database",
        "is read-only: writing needs write permission on the file and its folder (SQLite keeps "
        "a journal beside it); or copy it somewhere writable",
    ),
    (
        "lock timeout",
        "is locked by another writer for longer than ZOO_LOCK_TIMEOUT ({timeout:g} s): try "
        "again when it has finished, or wait longer with a larger ZOO_LOCK_TIMEOUT",
    ),
    ("value too long", "holds no value that long in this field: choose a shorter one"),
    ("database or disk is full", "cannot be written: its disk is full; free space there, or write somewhere else"),
    ("disk I/O error", "cannot be read or written (the disk, or a file size limit): check the disk it is on"),
    (
        "database is locked",
        "is locked by another writer for longer than ZOO_LOCK_TIMEOUT ({timeout:g} s): try "
        "again when it has finished, or wait longer with a larger ZOO_LOCK_TIMEOUT",
    ),
)


def meaning_of(detail: str) -> str | None:
    """What a driver's message means for a registry and what to do, or None for one zoo has no words for."""
    from zoo.constants import lock_timeout_s

    return next((m.format(timeout=lock_timeout_s()) for key, m in MEANINGS if key in detail), None)


def locked(meaning: str | None) -> bool:
    """Whether a meaning is another writer's lock (RegistryLocked, which a caller may wait out)."""
    return "ZOO_LOCK_TIMEOUT" in (meaning or "")
