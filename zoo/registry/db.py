"""Engines for the registry: SQLite tuned for concurrent indexers, schema revision checks, alembic upgrades."""

from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.orm import Session

from zoo.errors import RegistryNotFound, SchemaOutdated

# The alembic head this code reads and writes; a test checks it equals migrations' head.
SCHEMA_REVISION = "0003"
_PACKAGE = Path(__file__).resolve().parent.parent
# migrations/ at the repository root in a checkout; the wheel ships it inside the package (pyproject.toml)
MIGRATIONS = next((d for d in (_PACKAGE / "migrations", _PACKAGE.parent / "migrations") if (d / "env.py").is_file()),
                  _PACKAGE / "migrations")
BUSY_TIMEOUT_MS = 60_000


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url.removeprefix("sqlite:///"))
    return None


@lru_cache(maxsize=16)
def engine(url: str, write: bool = False) -> Engine:
    """One engine per (url, role). Writers take SQLite's write lock when a transaction begins
    (BEGIN IMMEDIATE), so two indexers queue on the busy timeout instead of failing on upgrade."""
    eng = create_engine(url)
    if eng.dialect.name == "sqlite":
        @event.listens_for(eng, "connect")
        def _connect(dbapi_connection, _record):
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves, below
            cur = dbapi_connection.cursor()
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            if write:
                cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer, nor it them
            cur.close()

        @event.listens_for(eng, "begin")
        def _begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
    return eng


def current_revision(eng: Engine) -> str | None:
    with eng.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


_checked: set[tuple[str, bool]] = set()


def open_registry(url: str, write: bool = False) -> Engine:
    """An engine on a registry at this code's schema revision. A writer upgrades a brand-new
    database; anything else at another revision is refused with what to run."""
    if (url, write) in _checked:  # checked once per process: get() is called in loops
        return engine(url, write)
    eng = _open_checked(url, write)
    _checked.add((url, write))
    return eng


def _open_checked(url: str, write: bool) -> Engine:
    path = _sqlite_path(url)
    if not write and path is not None and not path.exists():
        raise RegistryNotFound(f"no registry at {path}; index models into it with `zoo index`, or set ZOO_REGISTRY")
    eng = engine(url, write)
    revision = current_revision(eng)
    if revision == SCHEMA_REVISION:
        return eng
    if revision is None and write and not inspect(eng).get_table_names():
        upgrade(url)
        return eng
    where = path or url
    if revision is None:
        raise SchemaOutdated(f"{where} is not a zoo registry (no schema revision); create one with `zoo index` or `zoo db upgrade`")
    raise SchemaOutdated(
        f"the registry at {where} is at schema revision {revision}; this zoo needs {SCHEMA_REVISION}: "
        f"run `zoo db upgrade` (with ZOO_REGISTRY={url if path is None else path})"
    )


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to `revision` through the alembic migrations, the only way it changes."""
    from alembic import command

    cfg = alembic_config(url)
    with engine(url, write=True).connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()
    _checked.clear()


def session(url: str, write: bool = False) -> Session:
    return Session(open_registry(url, write), expire_on_commit=False)


def compact(url: str) -> None:
    """Fold the WAL into the file and shrink it: the shipped registry is one self-contained file."""
    import sqlite3

    path = _sqlite_path(url)
    if path is None:
        return
    for eng in (engine(url, True), engine(url, False)):
        eng.dispose()
    _checked.clear()
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute("VACUUM")
    finally:
        con.close()
