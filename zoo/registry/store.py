"""Registry queries: resolve a name, read a row, write one model atomically, delete, search."""

import difflib
import functools
import hashlib
from datetime import UTC, datetime
from typing import cast

from sqlalchemy import String, delete, func, select, text
from sqlalchemy.orm import Session

from zoo.columns import ANALYSIS, BY_NAME, COLUMNS, PUBLIC, check_name, finite
from zoo.errors import AmbiguousName, InvalidArgument, ModelExists, ModelNotFound
from zoo.model_info import ModelInfo, encode_tensors
from zoo.query import parse_sort
from zoo.registry.sql import bytewise, compile_search, sort_clause
from zoo.registry.tables import Model, ModelTensors, Weights
from zoo.registry.where import first_ids, in_order_sql, seek_sql, start_sql


def short_name(name: str) -> str:
    return name.split("/", 1)[1] if "/" in name else name


def resolve(session: Session, name: str) -> Model:
    """The row for a full name ("timm/resnet50") or a bare one ("resnet50") that only one family has."""
    row = session.scalar(select(Model).where(Model.name == name))
    if row is not None:
        return row
    rows = session.scalars(select(Model).where(Model.short == name).order_by(bytewise(Model.name))).all()
    if len(rows) == 1:
        return rows[0]
    if rows:
        raise AmbiguousName(name, [r.name for r in rows])
    raise ModelNotFound(name, suggest(session, name))


def suggest(session: Session, name: str, n: int = 5) -> list[str]:
    """The closest registered names, matching on full and bare names alike."""
    names = session.execute(select(Model.name, Model.short)).all()
    by_key: dict[str, str] = {}
    for full, short in names:
        by_key.setdefault(full, full)
        by_key.setdefault(short, full)
    close = difflib.get_close_matches(name, list(by_key), n=n * 2, cutoff=0.6)
    return list(dict.fromkeys(by_key[c] for c in close))[:n]


def tensor_blob(session: Session, model_id: int) -> bytes | None:
    return session.scalar(select(ModelTensors.data).where(ModelTensors.model_id == model_id))


def info(session: Session, name: str, tensors: bool = False) -> ModelInfo:
    row = resolve(session, name)
    weights = [
        {"tag": w.tag, "path": w.path, "sha256": w.sha256, "bytes": w.bytes}
        for w in session.scalars(select(Weights).where(Weights.model_id == row.id).order_by(bytewise(Weights.tag)))
    ]
    return ModelInfo.from_row(row, tensor_blob(session, row.id) if tensors else None, weights)


def drop_weights(session: Session, name: str, tags) -> None:
    row = resolve(session, name)
    session.execute(delete(Weights).where(Weights.model_id == row.id, Weights.tag.in_(list(tags))))


def weights_tags(session: Session, name: str) -> list[str]:
    return list(
        session.scalars(
            select(Weights.tag)
            .join(Model, Weights.model_id == Model.id)
            .where(Model.name == name)
            .order_by(bytewise(Weights.tag))
        )
    )


def _postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def lock_name(session: Session, name: str) -> None:
    """On PostgreSQL, hold a lock on this model name until the transaction ends. Read committed does not
    serialise writers as SQLite's BEGIN IMMEDIATE does: two indexers would both find no row and both insert
    (UniqueViolation). A 64-bit key from the name (hashtext's 32 bits would make collisions likely enough)."""
    if _postgresql(session):
        key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)
        session.execute(select(func.pg_advisory_xact_lock(key)))


def check_lengths(session: Session, values: dict, columns: dict) -> None:
    """PostgreSQL enforces VARCHAR(n), SQLite does not: refuse a value too long with a typed error naming
    the field, before the server would (a DataError deep in a transaction)."""
    if not _postgresql(session):
        return
    for field, value in values.items():
        size = columns[field]
        if size and isinstance(value, str) and len(value) > size:
            raise InvalidArgument(
                f"{field} is {len(value)} characters long ({value[:40]!r}...); a registry on "
                f"PostgreSQL holds at most {size}: choose a shorter one"
            )


def check_numbers(name: str, values: dict) -> None:
    """Refuse a number field's value that is not a finite number (a published NaN or infinity, a number as text):
    SQLite would keep it, PostgreSQL's NaN compares above every number, and neither is JSON."""
    for column in COLUMNS:
        value = values.get(column.name)
        if column.kind in ("int", "float") and value is not None and finite(value) is None:
            raise InvalidArgument(
                f"{name}: {column.name} is {value!r:.40}, not a finite number: leave it out (None) or give a number"
            )


def add_weights(session: Session, name: str, tag: str, path: str, sha256: str, nbytes: int) -> None:
    check_lengths(session, {"tag": tag}, {"tag": cast(String, Weights.__table__.c.tag.type).length})
    lock_name(session, name)
    row = resolve(session, name)
    session.execute(delete(Weights).where(Weights.model_id == row.id, Weights.tag == tag))
    session.add(
        Weights(
            model_id=row.id,
            tag=tag,
            path=path,
            sha256=sha256,
            bytes=nbytes,
            added_at=datetime.now(UTC).replace(tzinfo=None),
        )
    )


def ok_hash_of(session: Session, name: str) -> str | None:
    """The source hash of a model that built; failed ones are retried on every index run."""
    return session.scalar(select(Model.source_hash).where(Model.name == name, Model.status == "ok"))


def analyses_by_digest(session: Session, family: str) -> dict[str, dict]:
    """structure digest -> analysis columns (as stored) of a family's rows whose analysis ran: what a build
    with the same digest can reuse (zoo.structure)."""
    rows = session.execute(
        select(Model.structure_digest, *(getattr(Model, c.name) for c in ANALYSIS)).where(
            Model.family == family, Model.structure_digest.is_not(None), Model.scan_status == "ok"
        )
    )
    return {digest: dict(zip((c.name for c in ANALYSIS), values)) for digest, *values in rows}


def recorded_inputs(session: Session, name: str, family: str, builder: str) -> list | None:
    """The input spec recorded with `name` when it holds a model of this family and builder."""
    row = session.scalar(select(Model).where(Model.name == name))
    if row is None or (row.family, row.builder) != (family, builder):
        return None
    return BY_NAME["inputs"].decode(row.inputs)


def check_replace(session: Session, name: str, family: str, builder: str, replace: bool = False) -> None:
    """Refuse (ModelExists) to put a model of another family or builder under a name that holds one,
    unless replace: a name is never taken over silently."""
    _refuse_takeover(session, session.scalar(select(Model).where(Model.name == name)), family, builder, replace)


def _refuse_takeover(session: Session, row: Model | None, family: str, builder: str, replace: bool) -> None:
    if row is None or (row.family, row.builder) == (family, builder) or replace:
        return
    tags = session.scalars(select(Weights.tag).where(Weights.model_id == row.id)).all()
    raise ModelExists(
        f"{row.name} is already a {row.family} model (builder {row.builder}); indexing {family} "
        f"builder {builder} would replace it"
        + (f" and drop its weights tags {', '.join(tags)}" if tags else "")
        + ": choose another name, or replace it (force=True; zoo index --force)"
    )


def write_model(session: Session, record: dict, tensor_table, replace: bool = False) -> bool:
    """Insert one model, or update its row in place (its recorded weights stay), with its tensors, in the
    current transaction; True if the name was new. A row of another family or builder is replaced only with
    replace=True, and then its weights tags go with it: they were another model's files."""
    check_name(record["name"], new=True)  # every write: no control characters, nothing but the documented set
    values = {c.name: record.get(c.name, c.default) for c in COLUMNS}  # a failed build clears the old figures
    values.update(short=short_name(record["name"]), indexed_at=datetime.now(UTC).replace(tzinfo=None))
    values["arch_name"] = values["arch_name"] or record["name"]  # an architecture is its own
    check_lengths(session, values, {c.name: c.size for c in COLUMNS})
    check_numbers(record["name"], values)
    lock_name(session, record["name"])  # before the select: the select-then-insert must not interleave
    row = session.scalar(select(Model).where(Model.name == record["name"]))
    _refuse_takeover(session, row, record["family"], record["builder"], replace)
    new = row is None
    if row is None:
        row = Model(**values)
        session.add(row)
        session.flush()
    else:
        if (row.family, row.builder) != (record["family"], record["builder"]):
            session.execute(delete(Weights).where(Weights.model_id == row.id))
        for key, value in values.items():
            setattr(row, key, value)
        session.execute(delete(ModelTensors).where(ModelTensors.model_id == row.id))
    if tensor_table is not None:
        session.add(ModelTensors(model_id=row.id, data=encode_tensors(tensor_table)))
    return new


def remove(session: Session, name: str) -> str:
    row = resolve(session, name)
    session.execute(delete(Model).where(Model.id == row.id))  # tensors and weights go by ON DELETE CASCADE
    return row.name


def search(
    session: Session,
    expression,
    order_by: str | None = None,
    limit: int | None = None,
    fields: tuple[str, ...] | None = None,
) -> list[ModelInfo] | list[dict]:
    """ModelInfo per match; with `fields`, a dict of just those public fields per match (those columns
    alone are read: no ORM object and no JSON decoding for the rest, several times faster)."""
    if fields is not None:
        unknown = [f for f in fields if f not in BY_NAME or not BY_NAME[f].public]
        if unknown:
            raise InvalidArgument(f"unknown fields {unknown}; fields are: {', '.join(c.name for c in PUBLIC)}")
    # the public columns, not ORM objects: building 100 mapped objects costs more than the query (a million rows)
    query = (
        select(*(Model.__table__.c[c.name] for c in PUBLIC))
        if fields is None
        else select(*(getattr(Model, f) for f in fields))
    )
    where, dialect = None, session.get_bind().dialect.name
    if expression is not None and not (isinstance(expression, str) and not expression.strip()):
        where = compile_search(expression, dialect)
    order = (sort_clause(order_by, dialect),) if order_by else (bytewise(Model.name),)  # then by name, bytewise
    if limit is not None and where is not None:
        # SQLite sorts whole rows: 40,000 matches of a range, sorted by name for the first 100, cost 250 ms at
        # a million models. Sorting just the ids, from an index that covers the range and the sort (0005,
        # 0007), and reading the rows of the first `limit` after, costs a few ms; on PostgreSQL too, where
        # the ids of a range sorted by another number come from an index-only scan (108 -> 20 ms).
        ids = select(Model.id).where(where).order_by(*order).limit(limit)
        seek = functools.partial(_seek, session, dialect)
        prefix = first_ids(expression, order_by, limit, dialect, named=True, seek=seek)
        in_order = None
        if prefix is not None:  # a name glob's prefix, read as index ranges (zoo.registry.where.first_ids)
            sql, values = prefix
            assert isinstance(values, dict)  # named=True
            ids = text(sql).bindparams(**values).columns(Model.id)  # type: ignore[assignment]
        elif dialect == "postgresql" and order_by and limit and parse_sort(order_by)[0] in _INDEXED_NUMBERS:
            in_order = _first_in_order(session, expression, order_by, limit)
        query = query.where(Model.id.in_(ids.scalar_subquery() if in_order is None else in_order)).order_by(*order)
    else:
        query = (query if where is None else query.where(where)).order_by(*order)
        if limit is not None:
            query = query.limit(limit)
    if fields is None:
        # by position: a Row's attribute lookup costs more than the query (8,000 values for 100 models)
        decoders = [(c.name, c.decode) for c in PUBLIC]
        return [ModelInfo(**{n: d(v) for (n, d), v in zip(decoders, row)}) for row in session.execute(query)]
    columns = [BY_NAME[f] for f in fields]
    return [{c.name: c.decode(v) for c, v in zip(columns, row)} for row in session.execute(query)]


# The number columns an index leads with: a sort by one reads its rows in order (zoo.registry.where.in_order_sql).
_INDEXED_NUMBERS = frozenset(
    c for c in (next(iter(i.columns)).name for i in Model.__table__.indexes) if BY_NAME[c].search_type == "number"
)
# Rows an in-order read may pass over for each row it is to find (and its bounds): about 2 ms at a million models
# for the first 100, where reading and sorting every match of a range took 30-40 ms.
_BUDGET_PER_ROW, _LEAST_BUDGET, _MOST_BUDGET = 50, 1_000, 100_000


def _first_in_order(session: Session, expression, order_by: str, limit: int) -> list[int] | None:
    """PostgreSQL: the ids of a search's first `limit` rows by a number sort, read in that number's index within a
    budget, then from where the matches start (zoo.registry.where.in_order_sql); None where neither finds them
    (few matches, most without a value, ...): the caller's statement sorts the matches."""
    budget = min(max(limit * _BUDGET_PER_ROW, _LEAST_BUDGET), _MOST_BUDGET)

    def first(start=None) -> list[int]:
        sql, values = in_order_sql(expression, order_by, limit, budget, start)
        return list(session.scalars(text(sql), values))

    found = first()
    if len(found) == limit:
        return found
    sql, values = start_sql(expression, order_by)
    start, matches = session.execute(text(sql), values).one()
    if start is None or matches <= budget:  # few matches: sorting them is as quick
        return None
    found = first(start)
    return found if len(found) == limit else None


def count(session: Session, expression, limit: int | None = None) -> int:
    """How many rows match a search, at most `limit` (counting stops there)."""
    query = select(Model.id)
    dialect = session.get_bind().dialect.name
    if expression is not None and not (isinstance(expression, str) and not expression.strip()):
        query = query.where(compile_search(expression, dialect))
        # a name glob's prefix as index ranges, as search() reads it: `name~'timm/*'` counted 10,000 in 100 ms
        seek = functools.partial(_seek, session, dialect)
        prefix = None if limit is None else first_ids(expression, None, limit, dialect, named=True, seek=seek)
        if prefix is not None:
            sql, values = prefix
            assert isinstance(values, dict)  # named=True
            return session.scalar(text(f"SELECT count(*) FROM ({sql}) AS counted").bindparams(**values)) or 0
    if limit is not None:
        query = query.limit(limit)
    return session.scalar(select(func.count()).select_from(query.subquery())) or 0


def _seek(session: Session, dialect: str, column: str, value: str) -> str | None:
    return session.scalar(text(seek_sql(column, dialect, named=True)), {"v": value})


def variants_of(session: Session, name: str) -> tuple[str, list[ModelInfo]]:
    """The architecture of `name` (itself, or the one a variant names) and every pretrained variant of it;
    an architecture whose own row is not recorded is found by its variants."""
    arch: str | None
    try:
        row = resolve(session, name)
        arch = row.arch_name or row.name
    except ModelNotFound:
        archs = session.scalars(
            select(Model.arch_name)
            .where(Model.kind == "variant", (Model.arch_name == name) | Model.arch_name.like(f"%/{name}"))
            .distinct()
        ).all()
        if len(archs) != 1:
            raise
        arch = archs[0]
        assert arch is not None  # the where clause compared it with `name`: not NULL
    rows = session.scalars(
        select(Model).where(Model.arch_name == arch, Model.kind == "variant").order_by(bytewise(Model.name))
    )
    return arch, [ModelInfo.from_row(r) for r in rows]
