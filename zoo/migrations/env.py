"""Alembic environment: runs migrations on the connection zoo hands over (or on sqlalchemy.url)."""

from alembic import context
from sqlalchemy import create_engine

from zoo.registry.tables import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    with create_engine(config.get_main_option("sqlalchemy.url")).connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run()
