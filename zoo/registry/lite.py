"""Search and read a SQLite registry with the standard library's sqlite3, read-only, without importing SQLAlchemy.

`zoo search` in a fresh process spent about 0.4 s importing SQLAlchemy for a query that takes a millisecond.
It runs the SQL of zoo.registry.where, the one compiler both readers use (the property tests in
tests/test_search.py check both against one reference), and plans it for a million rows (see _plan:
an in-order scan may leave out a name glob's trigram pre-filter, which never changes the rows). Anything
it does not handle (a server URL, URL options, a registry at another schema revision, a file that cannot be
opened) returns None, and the caller takes the SQLAlchemy path, which gives the proper error; a database error
(a damaged file, a lock held past ZOO_LOCK_TIMEOUT) is the same RegistryError that path raises.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from datetime import datetime
from urllib.parse import quote

from zoo.columns import BY_NAME, PUBLIC
from zoo.constants import lock_timeout_s
from zoo.errors import RegistryError, RegistryLocked
from zoo.query import Expr, parse
from zoo.registry import SCHEMA_REVISION, locked, meaning_of
from zoo.registry.where import FINITE, compile_where, first_ids, order_sql, seek_sql

# A search that matches at least this share of the rows finds its first `limit` rows soonest by reading them
# in the sort order; a sparser one by reading its matches through the filter's index and sorting them.
_DENSE_SCAN = 5000  # rows an in-order scan may read to find `limit` matches
_SCAN_BUDGET = 200_000  # SQLite VM steps for that scan or the probe before it (about 10 ms); then the other plan
# A name glob's trigram pre-filter with more rows than this is left out of the in-order scan: SQLite reads the
# whole pre-filter (`id IN (...)`) before the first row, 4 s for `*model*` at a million models.
_FEW_CANDIDATES = 2000
_SMALL = 10_000  # rows (the largest id): a registry this small is searched as SQLite plans it, without _plan
_COLUMNS = ", ".join(f"models.{c.name}" for c in PUBLIC)


def sqlite_file(url: str) -> str | None:
    """The file of a plain sqlite:///PATH URL; None for anything else (a server, memory, URL options)."""
    if not url.startswith("sqlite:///") or "?" in url:
        return None
    path = url[len("sqlite:///") :]
    return path if path and path != ":memory:" else None


# SQLite's primary result codes for a WAL file whose -shm cannot be made or written here (SQLITE_READONLY_*
# and SQLITE_CANTOPEN, with their extended codes in the higher bits).
_READONLY, _CANTOPEN = 8, 14


def connect_read(path: str, **options) -> sqlite3.Connection:
    """A read-only connection to a registry file that writes nothing beside it. A rollback journal (the shipped
    registry's) needs nothing more. A file in WAL mode (a team's, whose writers keep WAL so that readers never
    block them) needs its -shm: where that cannot be made (a read-only mount, a folder of another user) and no
    -wal holds commits still to fold in, the file is opened immutable. Immutable reads take no locks: its owner
    writing it at the same time could tear them, which `zoo db compact` (back to a rollback journal) avoids for
    files shared that way.

    Only SQLite ever opens the file, to learn its mode too: in a process that holds connections to it, closing
    any other descriptor of the file (Python's open() to read its header, as this once did) drops every POSIX
    lock the process holds on it; a writer elsewhere then deletes the WAL under those connections, which read
    "database disk image is malformed" from then on and write their stale WAL back over the file when they
    close ("How To Corrupt An SQLite Database File", 2.2)."""
    uri = f"file:{quote(path)}?mode=ro"
    con = sqlite3.connect(uri, uri=True, **options)
    try:
        con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # reads the header; opens the -shm in WAL mode
        return con
    except sqlite3.OperationalError as e:
        con.close()
        if e.sqlite_errorcode & 0xFF not in (_READONLY, _CANTOPEN) or os.path.exists(path + "-wal"):
            raise
    return sqlite3.connect(uri + "&immutable=1", uri=True, **options)


def _open(url: str) -> sqlite3.Connection | None:
    """A read connection to a plain SQLite registry file at this schema; None where this path does not apply."""
    path = sqlite_file(url)
    return None if path is None else _connect(path)


def _connect(path: str) -> sqlite3.Connection | None:
    """A read connection; None where this path does not apply (no such file, another schema revision, not a zoo
    registry: the SQLAlchemy path then says which). A database error is a RegistryError, as on that path."""
    if not os.path.isfile(path):  # a FIFO would block the open forever: the SQLAlchemy path refuses it
        return None
    con = None
    try:
        con = connect_read(path, timeout=lock_timeout_s())
        revision = con.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error as e:
        if con is not None:
            con.close()
        if "no such table" in str(e):  # an empty database or another program's
            return None
        raise registry_error(path, e) from None
    if revision != (SCHEMA_REVISION,):
        con.close()
        return None
    return con


def registry_error(path: str, e: sqlite3.Error) -> RegistryError:
    """A driver's error as the RegistryError (or RegistryLocked) the SQLAlchemy path raises for it."""
    detail = str(e).strip().split("\n")[0]
    meaning = meaning_of(detail)
    kind = RegistryLocked if locked(meaning) else RegistryError
    return kind(f"the registry at sqlite:///{path} {meaning or 'refused the operation'} ({detail})")


def _ordered_index(con, field: str) -> str | None:
    """An index that reads rows in the sort field's order: of those that lead with it, the one with most columns.
    0007's (params|bytes|flops, name, the other numbers) hold what a range on another number tests, so an in-order
    scan skips a row that does not match without reading it from the table (a random page each: 10 us)."""
    leading = []
    for row in con.execute("PRAGMA index_list(models)"):
        columns = [c[2] for c in con.execute(f"PRAGMA index_info('{row[1]}')")]
        if columns[0] == field:
            leading.append((len(columns), row[1]))
    return max(leading)[1] if leading else None


def _plan(
    con,
    expression: Expr,
    where: str,
    params: list,
    order_by: str | None,
    order: str,
    field: str,
    descending: bool,
    limit: int,
    columns: str,
) -> list:
    """The first `limit` matches. SQLite's planner reads a range through the filter's index and sorts every
    match, whole rows: 40,000 matches cost 250 ms at a million models. Probe how many match (up to a cap)
    through that index; many -> read rows in the sort order (INDEXED BY its index) until `limit` have matched,
    within a budget (a sort order that runs against the filter, say bytes for a params range, would read most
    of the table); few, or over budget -> sort just the ids of the matches and read those `limit` rows.
    A name glob whose trigram pre-filter has many rows goes straight to the in-order scan, without the
    pre-filter; so does a search the probe cannot count within its budget (no index serves it: `*99`).
    where, params: compile_where(expression), every pre-filter in; columns: what each row holds (the SELECT list)."""
    first = f"SELECT models.id FROM models WHERE {where} ORDER BY {order} LIMIT ?"
    rows = con.execute("SELECT max(id) FROM models").fetchone()[0] or 0
    if rows <= _SMALL:  # any plan reads these rows in a few ms; planning one (index list, EXPLAIN, probe) costs more
        return con.execute(
            f"SELECT {columns} FROM models WHERE {where} ORDER BY {order} LIMIT ?", [*params, limit]
        ).fetchall()
    prefix = first_ids(expression, order_by, limit, seek=lambda column, value: _seek(con, column, value))
    if prefix is not None:  # a name glob's prefix, read as index ranges (zoo.registry.where.first_ids)
        return con.execute(
            f"SELECT {columns} FROM models WHERE models.id IN ({prefix[0]}) ORDER BY {order}", prefix[1]
        ).fetchall()
    cap = max(limit, 1) * rows // _DENSE_SCAN
    index = _ordered_index(con, field)
    if index is not None and limit and cap < rows and not _seeks_in_order(con, first, [*params, limit]):
        few = min(cap, _FEW_CANDIDATES)
        sparse = {}  # pattern -> whether its pre-filter has at most `few` rows (FTS5 streams them: ms)

        def prefilter(pattern: str) -> bool:
            if pattern not in sparse:
                sql = "SELECT count(*) FROM (SELECT rowid FROM models_fts WHERE models_fts.name LIKE ? LIMIT ?)"
                sparse[pattern] = con.execute(sql, [pattern, few + 1]).fetchone()[0] <= few
            return sparse[pattern]

        scan_where, scan_params = compile_where(expression, prefilter=prefilter)
        # SQLite puts NULL first: read backwards, an index gives the rows without a value last (as the search
        # orders them); read forwards, it gives those with a value, and the others come after
        nulls_left_out = field != "name" and not descending
        if nulls_left_out:
            scan_where = f"models.{field} IS NOT NULL AND {scan_where}"
        found = (
            None
            if scan_params != params
            else _within_budget(
                con, f"SELECT count(*) FROM (SELECT 1 FROM models WHERE {where} LIMIT ?)", [*params, cap]
            )
        )
        if found is None or found[0][0] >= cap:
            scan = f"SELECT {columns} FROM models INDEXED BY {index} WHERE {scan_where} AND %s ORDER BY {order} LIMIT ?"
            ordered = _within_budget(con, scan % "1 = 1", [*scan_params, limit])
            if ordered is None and field != "name":
                # A sort field that runs with the filter (bytes, for a params range) puts every match behind the
                # rows the filter leaves out: 380,000 of them at a million models, past the budget. The matches'
                # own first value (from the filter's index) is where they start in the sort index: read from there.
                start = con.execute(
                    f"SELECT {'max' if descending else 'min'}(models.{field}) FROM models WHERE {where}", params
                ).fetchone()[0]
                if start is not None:
                    bound = f"models.{field} {'<=' if descending else '>='} ?"
                    ordered = _within_budget(con, scan % bound, [*scan_params, start, limit])
            if ordered is not None and (len(ordered) == limit or not nulls_left_out):
                return ordered
    return con.execute(
        f"SELECT {columns} FROM models WHERE models.id IN ({first}) ORDER BY {order}", [*params, limit]
    ).fetchall()


def _seek(con, column: str, value: str) -> str | None:
    row = con.execute(seek_sql(column), [value]).fetchone()
    return None if row is None else row[0]


def _seeks_in_order(con, sql: str, params: list) -> bool:
    """Whether SQLite's own plan seeks the matches in the sort order (family=timm through (family, name)):
    every step a SEARCH, and no sort."""
    steps = [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + sql, params)]
    return all(step.startswith("SEARCH") and "TEMP B-TREE" not in step for step in steps)


def _within_budget(con, sql: str, params: list) -> list | None:
    """The statement's rows, or None if it runs past _SCAN_BUDGET VM steps (SQLite stops it there)."""
    con.set_progress_handler(lambda: 1, _SCAN_BUDGET)
    try:
        return con.execute(sql, params).fetchall()
    except sqlite3.OperationalError as e:
        if "interrupted" not in str(e):
            raise
        return None
    finally:
        con.set_progress_handler(None, 0)


def _decoder(column):
    if column.kind == "datetime":
        return lambda v: None if v is None else datetime.fromisoformat(v)
    return column.decode


def _infos(rows) -> list:
    """A ModelInfo per row of the public columns."""
    from zoo.model_info import ModelInfo

    names, decoders = [c.name for c in PUBLIC], [_decoder(c) for c in PUBLIC]
    return [ModelInfo(**{n: d(v) for n, d, v in zip(names, decoders, row)}) for row in rows]


def search(
    url: str, expression, order_by: str | None = None, limit: int | None = None, fields: tuple[str, ...] | None = None
):
    """What store.search returns, from a plain SQLite registry file at this schema; None where this path
    does not apply (the caller then takes the SQLAlchemy path)."""
    path = sqlite_file(url)
    if path is None or (fields is not None and any(f not in BY_NAME or not BY_NAME[f].public for f in fields)):
        return None
    has_where = expression is not None and not (isinstance(expression, str) and not expression.strip())
    if has_where:
        expression = parse(expression) if isinstance(expression, str) else expression  # syntax errors before I/O
    where, params = compile_where(expression) if has_where else ("1 = 1", [])
    order, field, descending = order_sql(order_by)
    # the fields asked for and no others: 100 rows of every column took 5 ms to read, the table's five 1 ms
    selected = None if fields is None else list(dict.fromkeys(fields))
    columns = _COLUMNS if selected is None else ", ".join(f"models.{f}" for f in selected) or "models.id"
    con = _connect(path)
    if con is None:
        return None
    try:
        if limit is not None and has_where:
            rows = _plan(con, expression, where, params, order_by, order, field, descending, limit, columns)
        else:
            sql = f"SELECT {columns} FROM models WHERE {where} ORDER BY {order}"
            args = (sql + " LIMIT ?", [*params, limit]) if limit is not None else (sql, params)
            rows = con.execute(*args).fetchall()
    except sqlite3.Error as e:
        raise registry_error(path, e) from None
    finally:
        con.close()
    if selected is None:
        return _infos(rows)
    decoders = [_decoder(BY_NAME[f]) for f in selected]
    return [{f: decode(v) for f, decode, v in zip(selected, decoders, row)} for row in rows]


def count(url: str, expression, limit: int | None = None) -> int | None:
    """What store.count returns, from a plain SQLite registry file at this schema; None where this path does not
    apply. Planned as _plan plans a search: a name glob's prefix as index ranges (first_ids: `name~'timm/*'`, a
    quarter of a million matches, scanned for 10,000 took 50 ms); a trigram pre-filter with more rows than
    _FEW_CANDIDATES left out of a scan that ends at `limit` matches (FTS5 hands over 10,000 rows in 20 ms),
    unless that scan runs past its budget (few matches among many rows)."""
    path = sqlite_file(url)
    if path is None:
        return None
    has_where = expression is not None and not (isinstance(expression, str) and not expression.strip())
    if has_where:
        expression = parse(expression) if isinstance(expression, str) else expression  # syntax errors before I/O
    con = _connect(path)
    if con is None:
        return None
    try:
        if limit is not None and has_where:
            prefix = first_ids(expression, None, limit, seek=lambda column, value: _seek(con, column, value))
            if prefix is not None:
                return con.execute(f"SELECT count(*) FROM ({prefix[0]})", prefix[1]).fetchone()[0]
        sparse: dict[str, bool] = {}  # pattern -> whether its pre-filter has few rows

        def prefilter(pattern: str) -> bool:
            if limit is not None and pattern not in sparse:
                few = min(limit, _FEW_CANDIDATES)
                sql = "SELECT count(*) FROM (SELECT rowid FROM models_fts WHERE models_fts.name LIKE ? LIMIT ?)"
                sparse[pattern] = con.execute(sql, [pattern, few + 1]).fetchone()[0] <= few
            return sparse.get(pattern, True)

        where, params = compile_where(expression, prefilter=prefilter) if has_where else ("1 = 1", [])
        sql = f"SELECT count(*) FROM (SELECT 1 FROM models WHERE {where}{'' if limit is None else ' LIMIT ?'})"
        params = params if limit is None else [*params, limit]
        if not all(sparse.values()):
            found = _within_budget(con, sql, params)
            if found is not None:
                return found[0][0]
            where, params = compile_where(expression)  # few matches among many rows: every pre-filter back
            sql, params = f"SELECT count(*) FROM (SELECT 1 FROM models WHERE {where} LIMIT ?)", [*params, limit]
        return con.execute(sql, params).fetchone()[0]
    except sqlite3.Error as e:
        raise registry_error(path, e) from None
    finally:
        con.close()


def info(url: str, name: str, tensors: bool = False):
    """(ModelInfo with its recorded weights, and its tensor table when asked; its source hash) for a full
    name or a bare one that only one family has (store.resolve's rule), read in one snapshot; None where
    this path does not apply or the name is not exactly one model: the SQLAlchemy path then gives the
    error, with the close names."""
    from zoo.model_info import ModelInfo, decode_tensors

    con = _open(url)
    if con is None:
        return None
    try:
        con.execute("BEGIN")  # one snapshot: the row, its tensor table and its weights from the same write
        select = f"SELECT models.id, models.source_hash, {_COLUMNS} FROM models WHERE models.%s = ? LIMIT 2"
        rows = con.execute(select % "name", [name]).fetchall() or con.execute(select % "short", [name]).fetchall()
        if len(rows) != 1:
            return None
        model_id, source_hash, *values = rows[0]
        blob = (
            con.execute("SELECT data FROM model_tensors WHERE model_id = ?", [model_id]).fetchone() if tensors else None
        )
        weights = [
            dict(zip(("tag", "path", "sha256", "bytes"), w))
            for w in con.execute(
                "SELECT tag, path, sha256, bytes FROM weights WHERE model_id = ? ORDER BY CAST(tag AS BLOB)", [model_id]
            )
        ]
    except sqlite3.Error as e:
        raise registry_error(str(sqlite_file(url)), e) from None
    finally:
        con.close()
    fields = {c.name: _decoder(c)(v) for c, v in zip(PUBLIC, values)}
    table = decode_tensors(blob[0]) if blob else None
    return ModelInfo(**fields, tensor_table=table, weights=weights), source_hash


def variants(url: str, name: str):
    """store.variants_of from a plain SQLite registry file at this schema (`zoo weights list`); None where this
    path does not apply or the name is not exactly one architecture: the SQLAlchemy path then gives the error."""
    con = _open(url)
    if con is None:
        return None
    try:
        con.execute("BEGIN")  # one snapshot: the architecture and its variants
        arch = None
        for column in ("name", "short"):  # store.resolve's rule: a full name, else a bare one only one family has
            rows = con.execute(f"SELECT arch_name, name FROM models WHERE {column} = ? LIMIT 2", [name]).fetchall()
            if rows:
                arch = rows[0][0] or rows[0][1] if len(rows) == 1 else None
                break
        else:  # an architecture whose own row is not recorded, found by its variants
            rows = con.execute(
                "SELECT DISTINCT arch_name FROM models WHERE kind = 'variant' AND (arch_name = ? OR "
                "substr(arch_name, -?) = ?) LIMIT 2",
                [name, len(name) + 1, "/" + name],
            ).fetchall()
            arch = rows[0][0] if len(rows) == 1 else None
        if arch is None:
            return None
        rows = con.execute(
            f"SELECT {_COLUMNS} FROM models WHERE arch_name = ? AND kind = 'variant' ORDER BY CAST(name AS BLOB)",
            [arch],
        ).fetchall()
    except sqlite3.Error as e:
        raise registry_error(str(sqlite_file(url)), e) from None
    finally:
        con.close()
    return arch, _infos(rows)


def measurements(url: str, name: str) -> list[dict] | None:
    """zoo.registry.measurements.of_model for a full name, from a plain SQLite registry file at this schema; None
    where this path does not apply."""
    from zoo.throughput.measured import clean_run

    con = _open(url)
    if con is None:
        return None
    try:
        cur = con.execute(
            "SELECT measurements.* FROM measurements JOIN models ON models.id = measurements.model_id "
            "WHERE models.name = ? ORDER BY measurements.id",
            [name],
        )
        names, rows = [d[0] for d in cur.description], cur.fetchall()
    except sqlite3.Error as e:
        raise registry_error(str(sqlite_file(url)), e) from None
    finally:
        con.close()
    decode: dict[str, Callable] = {"compiled": bool, "channels_last": bool, "measured_at": datetime.fromisoformat}
    return [
        clean_run({n: decode.get(n, lambda v: v)(v) for n, v in zip(names, row) if n not in ("id", "model_id")})
        for row in rows
    ]


def fastest(url: str, names: list[str], device: str, mode: str) -> dict[str, float] | None:
    """zoo.registry.measurements.fastest from a plain SQLite registry file at this schema; None where this path
    does not apply."""
    con = _open(url)
    if con is None:
        return None
    out: dict[str, float] = {}
    try:
        for i in range(0, len(names), 500):  # bound the statement's parameters
            chunk = names[i : i + 500]
            out.update(
                con.execute(
                    "SELECT models.name, max(measurements.samples_per_s) FROM measurements JOIN models ON models.id = "
                    "measurements.model_id WHERE measurements.device = ? AND measurements.mode = ? AND models.name IN "
                    f"({', '.join('?' * len(chunk))}) AND measurements.samples_per_s {FINITE} GROUP BY models.name",
                    [device, mode, *chunk],
                ).fetchall()
            )
    except sqlite3.Error as e:
        raise registry_error(str(sqlite_file(url)), e) from None
    finally:
        con.close()
    return out
