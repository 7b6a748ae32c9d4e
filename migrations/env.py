"""Alembic environment: runs migrations on the connection zoo hands over (zoo db upgrade), or, for
the alembic command run from the repository root, on $ZOO_REGISTRY or the ini's sqlalchemy.url."""

import os

from alembic import context
from sqlalchemy import create_engine

from zoo.registry.tables import Base, compared

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    if os.environ.get("ZOO_REGISTRY", "").strip():
        from zoo.constants import registry_url

        return registry_url()
    return config.get_main_option("sqlalchemy.url")


def _migrate(connection) -> None:
    # batch mode: SQLite alters tables by copying them, and alembic does that for us
    # include_name: the per-backend search indexes of 0005 are not in the ORM metadata (zoo.registry.tables)
    context.configure(
        connection=connection, target_metadata=target_metadata, render_as_batch=True, include_name=compared
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _migrate(connection)
else:
    with create_engine(_url()).connect() as conn:
        _migrate(conn)
