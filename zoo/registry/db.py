"""Engines for the registry: SQLite tuned for concurrent indexers, schema revision checks, alembic upgrades,
and the driver's errors turned into RegistryError that names the registry (password masked)."""

import contextlib
import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, exc, inspect, text
from sqlalchemy.orm import Session

from zoo.caching import register, trim
from zoo.constants import lock_timeout_s
from zoo.errors import RegistryError, RegistryLocked, RegistryNotFound, SchemaOutdated, ZooError
from zoo.registry import (
    SCHEMA_REVISION,  # the alembic head this code reads and writes
    lite,
    locked,
    meaning_of,
)

_PACKAGE = Path(__file__).resolve().parent.parent
# migrations/ at the repository root in a checkout; the wheel ships it inside the package (pyproject.toml)
MIGRATIONS = next(
    (d for d in (_PACKAGE / "migrations", _PACKAGE.parent / "migrations") if (d / "env.py").is_file()),
    _PACKAGE / "migrations",
)


def _sqlite_path(url: str) -> Path | None:
    """The file of a SQLite registry URL (query options such as ?mode=ro aside); None for a server or memory."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError):
        return None
    database = parsed.database
    if not parsed.drivername.startswith("sqlite") or not database or database == ":memory:":
        return None
    return Path(database.removeprefix("file:"))


def masked(url: str) -> str:
    """The URL as every message and repr shows it: the password, if any, as ***."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (exc.ArgumentError, ValueError):  # unparsable (a port that is no number): keep no credentials
        return url.split("://", 1)[0] + "://***" if "@" in url else url


def exists(url: str) -> bool:
    """Whether the registry is there already (a server database is taken to be)."""
    path = _sqlite_path(url)
    return path is None or path.exists()


@contextlib.contextmanager
def translated(url: str):
    """Errors from SQLAlchemy or the database driver, raised as RegistryError naming the registry and the next step."""
    try:
        yield
    except ZooError:
        raise
    except OSError as e:  # the file system's own refusal: a name too long, a folder without permission
        raise RegistryError(f"the registry at {masked(url)} cannot be opened ({e})") from None
    except exc.DBAPIError as e:
        detail = (str(e.orig) if e.orig is not None else str(e)).strip().split("\n")[0]
        meaning = meaning_of(detail)
        if meaning is None and _sqlite_path(url) is None and isinstance(e, exc.OperationalError):
            meaning = "cannot be reached: check that the server is running and the URL (host, port, user, database)"
        kind = RegistryLocked if locked(meaning) else RegistryError
        raise kind(f"the registry at {masked(url)} {meaning or 'refused the operation'} ({detail})") from None


def _wal(dbapi_connection) -> None:
    """Switch a SQLite registry to WAL (readers never block the writer, nor it them). The switch needs the
    file to itself and SQLite does not wait for that with its busy timeout, so wait here as long."""
    cur = dbapi_connection.cursor()
    try:
        if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
            return
        deadline = time.monotonic() + lock_timeout_s()
        while True:
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                return
            except Exception as e:  # the driver's OperationalError: locked by another connection
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        cur.close()


_engines: dict[tuple[str, bool], Engine] = {}
# A transaction left open by a dead or stuck client (a forked worker holding its parent's connection, a
# debugger) would hold its row locks forever: the server ends such a session after this long.
IDLE_IN_TRANSACTION_S = 60


def _server_options(url: str) -> dict:
    """PostgreSQL: wait for a lock at most ZOO_LOCK_TIMEOUT (then a RegistryError, as SQLite's busy timeout
    gives), end sessions idle in a transaction, and test pooled connections (the server may have ended one)."""
    if not url.startswith("postgresql"):
        return {}
    # at least 1 ms: PostgreSQL reads 0 as "wait forever", where ZOO_LOCK_TIMEOUT=0 means "do not wait"
    options = (
        f"-c lock_timeout={max(1, int(lock_timeout_s() * 1000))} -c idle_in_transaction_session_timeout="
        f"{IDLE_IN_TRANSACTION_S * 1000}"
    )
    return {"connect_args": {"options": options}, "pool_pre_ping": True}


def engine(url: str, write: bool = False) -> Engine:
    """One engine per (url, role), kept for the process. Writers take SQLite's write lock when a transaction
    begins (BEGIN IMMEDIATE), so two indexers queue on the busy timeout instead of failing on upgrade."""
    if (url, write) in _engines:
        return _engines[(url, write)]
    options = _server_options(url)
    if options and not write:
        # one snapshot per read: under READ COMMITTED each statement sees the latest commit, so info() could
        # read a model's row before a writer's commit and its tensor table after it (seen with 3 readers);
        # a read-only REPEATABLE READ transaction never fails to serialise. SQLite's reads are snapshots already.
        options["isolation_level"] = "REPEATABLE READ"
    path = _sqlite_path(url)
    if path is not None and path.exists() and not path.is_file():  # opening a FIFO would block forever
        raise RegistryError(
            f"the registry at {path} cannot be opened: it is not a regular file (a directory, a FIFO, "
            f"a device): give the path of a registry file"
        )
    if not write and lite.sqlite_file(url) and path is not None and path.is_file():
        # read-only, as the lite reader reads (see lite.connect_read): a reader never writes, nor checkpoints
        # and deletes the WAL when it closes last
        options["creator"] = lambda: lite.connect_read(str(path), check_same_thread=False)
    try:
        eng = create_engine(url, **options)
    except ImportError as e:  # a server URL whose driver is not installed
        raise RegistryError(
            f"{masked(url)}: its database driver is not installed ({e}); for PostgreSQL: pip install 'zoo[postgres]'"
        ) from None
    except (exc.ArgumentError, ValueError) as e:  # an unknown dialect, a port that is no number, ...
        raise RegistryError(
            f"{masked(url)}: not a registry URL zoo can open ({masked(str(e))}); give a file path, "
            f"sqlite:///PATH or a server URL such as postgresql+psycopg://USER@HOST/DB"
        ) from None
    if eng.dialect.name == "sqlite":

        @event.listens_for(eng, "connect")
        def _connect(dbapi_connection, _record):
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves, below
            cur = dbapi_connection.cursor()
            cur.execute(f"PRAGMA busy_timeout={int(lock_timeout_s() * 1000)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
            if write:
                _wal(dbapi_connection)

        @event.listens_for(eng, "begin")
        def _begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    if len(_engines) >= 256:
        _dispose_engines()
    _engines[(url, write)] = eng
    return eng


def _dispose_engines() -> None:
    for eng in _engines.values():
        eng.dispose()
    _engines.clear()


register("registry engines", bound=256, clear=_dispose_engines, size=lambda: len(_engines))  # two per registry URL


# No connection crosses a fork: a child that used or closed its parent's connections (a forked indexer worker,
# a DataLoader worker of a training script) would share their descriptors, sockets and SQLite's lock state. The
# child opens its own; the parent's stay referenced here, so that the child never finalizes them (closing a
# PostgreSQL connection there would end the parent's session; SQLAlchemy's advice: dispose(close=False)).
_inherited: list[Engine] = []


def _forget_engines_in_child() -> None:
    _inherited.extend(_engines.values())
    _engines.clear()
    _checked.clear()


def current_revision(eng: Engine) -> str | None:
    with translated(str(eng.url)), eng.connect() as conn:
        return _revision_on(conn)


def _revision_on(conn) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


# Any fixed 64-bit number: the key of the PostgreSQL advisory lock that schema changes take.
_SCHEMA_LOCK = 0x7A6F6F5F73636831


@contextlib.contextmanager
def schema_locked(url: str):
    """A writer's connection inside a transaction that holds the registry's schema lock until it commits:
    SQLite's BEGIN IMMEDIATE (the write lock), a transaction-scoped advisory lock on PostgreSQL. Whoever
    creates or upgrades the schema checks it again in here: another process may just have done it."""
    with engine(url, write=True).connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
        else:
            conn.begin()  # BEGIN IMMEDIATE, see engine()
        yield conn
        conn.commit()


def revision_of(url: str) -> str | None:
    """The schema revision of a registry (None: an empty database); a missing file is RegistryNotFound."""
    path = _sqlite_path(url)
    if path is not None and not path.exists():
        raise RegistryNotFound(f"no registry at {path}")
    return current_revision(engine(url))


def known_revisions() -> list[str]:
    """Every schema revision this zoo's migrations know, oldest first."""
    from alembic.script import ScriptDirectory

    return [
        r.revision for r in reversed(list(ScriptDirectory.from_config(alembic_config("sqlite://")).walk_revisions()))
    ]


_checked: set[tuple[str, bool]] = set()
register("registry schema checks", _checked, 256)
os.register_at_fork(after_in_child=_forget_engines_in_child)


def open_registry(url: str, write: bool = False, create: bool = False) -> Engine:
    """An engine on a registry at this code's schema revision. create=True (indexing, `zoo db upgrade`)
    makes a brand-new database; anything else at another revision is refused with what to run. The
    check reads only, so a refused write leaves the file as it was."""
    if (url, write) in _checked:  # checked once per process: get() is called in loops
        return engine(url, write)
    path = _sqlite_path(url)
    if not create and path is not None and not path.exists():
        raise RegistryNotFound(
            f"no registry at {path}: `zoo index` or `zoo db upgrade` create one; or point "
            f"--registry (or ZOO_REGISTRY) at an existing registry"
        )
    with translated(url):
        revision, tables = _revision_and_tables(engine(url, write=False))
        if revision is None and create and not tables:
            upgrade(url)
        elif revision != SCHEMA_REVISION:
            _refuse(url, revision)
        eng = engine(url, write)
        if write:
            with eng.connect():  # the writer's own set-up (WAL) happens now, inside the translation
                pass
    trim(_checked, 256)
    _checked.add((url, write))
    return eng


def _refuse(url: str, revision: str | None) -> None:
    where = _sqlite_path(url) or masked(url)
    if revision is None:
        raise SchemaOutdated(
            f"{where} is not a zoo registry (no schema revision); create one with `zoo index` or `zoo db upgrade`"
        )
    known = known_revisions()
    if revision not in known:
        raise SchemaOutdated(
            f"the registry at {where} was made by a newer zoo (schema revision {revision}; this zoo "
            f"knows up to {known[-1]}): upgrade zoo to read it"
        )
    raise SchemaOutdated(
        f"the registry at {where} is at schema revision {revision}; this zoo needs {SCHEMA_REVISION}: "
        f"run `zoo db upgrade --registry {where}`"
    )


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to `revision` through the alembic migrations, the only way it changes (a new
    SQLite file is created). A registry from a newer zoo, a database of something else and an unknown
    revision are refused before anything is written."""
    from alembic import command

    known = known_revisions()
    if revision != "head" and revision not in known:
        raise SchemaOutdated(f"no schema revision {revision!r}: this zoo knows {', '.join(known)} (or head)")
    with translated(url):
        _check_upgradable(url, *_revision_and_tables(engine(url)))
    with translated(url), schema_locked(url) as conn:  # the check again, under the lock
        _check_upgradable(url, _revision_on(conn), inspect(conn).get_table_names())
        cfg = alembic_config(url)
        cfg.attributes["connection"] = conn  # the migrations run inside this locked transaction
        command.upgrade(cfg, revision)
    _checked.clear()


def _revision_and_tables(eng: Engine) -> tuple[str | None, list[str]]:
    """The schema revision and the table names, the tables read first. Another process
    creating the schema commits its tables and its revision together, so a revision read after the tables is
    never older than they are: tables without a revision are another program's database, not a schema that
    was committed between the two reads (seen once: three first uses at once on PostgreSQL, one refused)."""
    tables = inspect(eng).get_table_names()
    return current_revision(eng), tables


def _check_upgradable(url: str, current: str | None, tables: list[str]) -> None:
    """Refused before anything is written (SQLite's journal mode included): a registry from a newer zoo,
    and another program's database (zoo adds no tables to it)."""
    if current is not None and current not in known_revisions():
        _refuse(url, current)
    if current is None and tables:
        _refuse(url, None)


@contextlib.contextmanager
def session(url: str, write: bool = False, create: bool = False):
    """A Session on the registry (see open_registry); driver errors inside come out as RegistryError."""
    with translated(url), Session(open_registry(url, write, create), expire_on_commit=False) as s:
        yield s


def compact(url: str) -> str:
    """SQLite: fold the WAL into the file and shrink it (the shipped registry is one self-contained file).
    PostgreSQL: VACUUM (ANALYZE), which frees dead rows and refreshes the planner's statistics. Returns
    what was done, for the CLI to say."""
    path = _sqlite_path(url)
    if path is None:
        eng = open_registry(url)
        if eng.dialect.name != "postgresql":
            return "nothing to do: this database compacts itself"
        with translated(url), eng.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (ANALYZE)"))  # not allowed inside a transaction, hence autocommit
        return "vacuumed and analysed"
    open_registry(url)  # a registry at this schema, or a clear error, before anything is written
    for eng in (engine(url, True), engine(url, False)):
        eng.dispose()
    _checked.clear()
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute(f"PRAGMA busy_timeout={int(lock_timeout_s() * 1000)}")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute("VACUUM")
    except sqlite3.Error as e:
        meaning = meaning_of(str(e)) or "could not be compacted"
        raise RegistryError(f"the registry at {path} {meaning} ({e})") from None
    finally:
        con.close()
    return "compacted"
