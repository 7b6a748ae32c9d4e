"""The schema is alembic's: upgrades from empty and from every earlier revision; old databases are refused clearly."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from zoo.errors import SchemaOutdated
from zoo.registry import db
from zoo.registry.tables import Base


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(db.alembic_config("sqlite://"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _assert_schema_matches_orm(url: str) -> None:
    with create_engine(url).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_code_revision_is_the_migrations_head():
    assert _revisions()[-1] == db.SCHEMA_REVISION


def test_upgrade_from_an_empty_database(fresh_url):
    db.upgrade(fresh_url)
    assert db.current_revision(db.engine(fresh_url)) == db.SCHEMA_REVISION
    _assert_schema_matches_orm(fresh_url)


@pytest.mark.parametrize("start", _revisions())
def test_upgrade_from_every_earlier_revision(tmp_path, start):
    url = f"sqlite:///{tmp_path / f'at_{start}.db'}"
    db.upgrade(url, start)
    assert db.current_revision(db.engine(url)) == start
    db.upgrade(url)
    assert db.current_revision(db.engine(url)) == db.SCHEMA_REVISION
    _assert_schema_matches_orm(url)


def test_an_older_revision_is_refused_with_the_command_to_run(fresh_url):
    db.upgrade(fresh_url, _revisions()[-2])
    db._checked.clear()
    with pytest.raises(SchemaOutdated, match="zoo db upgrade"):
        db.open_registry(fresh_url)


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
