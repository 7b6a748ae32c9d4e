"""Copy a whole registry between any two URLs (SQLite <-> PostgreSQL): every table row for row, ids kept."""

from typing import cast

from sqlalchemy import Table, delete, func, select, text

from zoo.columns import finite
from zoo.errors import RegistryError
from zoo.registry import db
from zoo.registry.tables import Measurement, Model, ModelTensors, Weights

# Parents before children (foreign keys); each with the key it is read in order of.
TABLES: tuple[Table, ...] = tuple(cast(Table, m.__table__) for m in (Model, ModelTensors, Weights, Measurement))
_BATCH = 500


def _count(conn) -> int:
    return conn.execute(select(func.count()).select_from(Model.__table__)).scalar()


def copy_registry(src: str, dst: str, replace: bool = False) -> dict[str, int]:
    """Copy the registry at src into dst in one transaction on dst: the schema is made through the
    migrations, ids are kept and PostgreSQL's sequences set past them (a later insert must not collide).
    A target that holds models is refused unless replace, which drops them first. Returns rows per table."""
    if src == dst:
        raise RegistryError(f"{db.masked(src)}: source and target are the same registry")
    reader = db.open_registry(src)  # a registry at this schema, or a clear error, before dst is touched
    if db.exists(dst) and not replace and db.revision_of(dst) is not None:
        with db.translated(dst), db.engine(dst).connect() as conn:
            _refuse_non_empty(dst, _count(conn))
    db.upgrade(dst)  # creates the schema (or brings it up to date) through the migrations
    counts = {}
    # Reads are src's errors and writes dst's (a full disk is the target's): each write is translated
    # for dst inside the block that translates for src, which lets zoo's errors pass.
    with db.translated(dst), db.schema_locked(dst) as target, db.translated(src), reader.connect() as source:

        def write(*statement):
            with db.translated(dst):
                target.execute(*statement)

        _refuse_non_empty(dst, 0 if replace else _count(target))  # again, under the lock
        for table in reversed(TABLES):
            write(delete(table))
        for table in TABLES:
            counts[table.name] = 0
            rows = source.execute(select(table).order_by(*table.primary_key.columns))
            numbers = [c.name for c in table.c if c.type.python_type in (int, float)]
            while chunk := rows.fetchmany(_BATCH):
                batch = [dict(r._mapping) for r in chunk]
                _refuse_non_numbers(src, table, numbers, batch)
                write(table.insert(), batch)
                counts[table.name] += len(batch)
        if target.dialect.name == "postgresql":
            for table in TABLES:
                if "id" in table.c:  # serial ids: the next insert continues after the copied ones
                    write(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                            f"coalesce(max(id), 1), max(id) IS NOT NULL) FROM {table.name}"
                        )
                    )
    return counts


def _refuse_non_numbers(src: str, table: Table, numbers: list[str], rows: list[dict]) -> None:
    """Refuse a number column's value that is not a finite number (put in by hand: SQLite keeps text and infinity
    in any column, PostgreSQL keeps NaN): it would sort above every number in the copy and break its JSON."""
    for row in rows:
        for column in numbers:
            if row[column] is not None and finite(row[column]) is None:
                which = row.get("name") or f"id {row.get('id', row.get('model_id'))}"
                raise RegistryError(
                    f"{db.masked(src)}: {table.name} {which}: {column} is {row[column]!r:.40}, not a "
                    f"finite number; nothing was copied: set it to a number (or NULL) in the source, "
                    f"or remove that row, and copy again"
                )


def _refuse_non_empty(dst: str, models: int) -> None:
    if models:
        raise RegistryError(
            f"the registry at {db.masked(dst)} already holds {models} models: copy into an empty "
            f"one, or pass --replace (replace=True) to drop them first"
        )
