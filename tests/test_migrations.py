"""The schema is alembic's: upgrades from empty and from every earlier revision, on SQLite and PostgreSQL; old
databases are refused clearly; concurrent first uses of an empty database all succeed."""

import subprocess
import sys

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from tests.conftest import ROOT
from zoo.errors import SchemaOutdated
from zoo.registry import db
from zoo.registry.tables import Base, compared


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(db.alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _assert_schema_matches_orm(url: str) -> None:
    with create_engine(url).connect() as conn:
        # objects the migrations create per backend that the ORM cannot express (tables.SEARCH_ACCELERATORS)
        context = MigrationContext.configure(conn, opts={"include_name": compared})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_code_revision_is_the_migrations_head():
    assert _revisions()[-1] == db.SCHEMA_REVISION


def test_upgrade_from_an_empty_database(backend_url):
    db.upgrade(backend_url)
    assert db.current_revision(db.engine(backend_url)) == db.SCHEMA_REVISION
    _assert_schema_matches_orm(backend_url)


@pytest.mark.parametrize("start", _revisions())
def test_upgrade_from_every_earlier_revision(backend_url, start):
    url = backend_url
    db.upgrade(url, start)
    assert db.current_revision(db.engine(url)) == start
    db.upgrade(url)
    assert db.current_revision(db.engine(url)) == db.SCHEMA_REVISION
    _assert_schema_matches_orm(url)


def test_an_older_revision_is_refused_with_the_command_to_run(backend_url):
    db.upgrade(backend_url, _revisions()[-2])
    db._checked.clear()
    with pytest.raises(SchemaOutdated, match="zoo db upgrade") as err:
        db.open_registry(backend_url)
    assert "s3cret" not in str(err.value)  # tests/pg.py puts a password in every PostgreSQL URL


def test_three_first_uses_of_an_empty_database_all_succeed(backend_url):
    """Each creates the schema unless another did first: under the schema lock, checked again inside."""
    code = (
        "import sys; from zoo.registry import db; db.open_registry(sys.argv[1], write=True, create=True); "
        "print(db.current_revision(db.engine(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, backend_url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == db.SCHEMA_REVISION, err
    _assert_schema_matches_orm(backend_url)


def test_the_revision_is_read_after_the_tables(backend_url):
    """Another process commits the schema's tables and its revision together: read in this order, tables
    without a revision can only be another program's database, never a schema committed between the reads."""
    from sqlalchemy import event

    db.upgrade(backend_url)
    statements = []
    eng = db.engine(backend_url)
    record = lambda conn, cursor, statement, *rest: statements.append(statement)  # noqa: E731 - a one-line event listener
    event.listen(eng, "before_cursor_execute", record)
    try:
        revision, tables = db._revision_and_tables(eng)
    finally:
        event.remove(eng, "before_cursor_execute", record)
    assert revision == db.SCHEMA_REVISION and "models" in tables
    assert "version_num" in statements[-1] and len(statements) > 1


def test_a_missing_registry_file_is_a_clear_error(tmp_path):
    from zoo.errors import RegistryNotFound

    with pytest.raises(RegistryNotFound, match="zoo index"):
        db.open_registry(f"sqlite:///{tmp_path / 'nothing.db'}")
    assert not (tmp_path / "nothing.db").exists()  # reading never creates a file


def test_a_writer_creates_a_new_registry_through_the_migrations_only_when_asked(fresh_url):
    from zoo.errors import RegistryNotFound

    with pytest.raises(RegistryNotFound):  # a plain write (rm, weights add) never creates one
        db.open_registry(fresh_url, write=True)
    db.open_registry(fresh_url, write=True, create=True)  # indexing does
    assert db.current_revision(db.engine(fresh_url)) == db.SCHEMA_REVISION
