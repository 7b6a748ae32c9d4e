"""The one compiler of a search (zoo.query's tree) to SQL: a WHERE clause and an ORDER BY, as text with every
value of the search in a bound parameter. Both readers use it: zoo.registry.sql wraps it for SQLAlchemy
(SQLite and PostgreSQL), zoo.registry.lite runs it through the standard sqlite3 module. Pure: it imports
neither SQLAlchemy nor torch.

What differs by backend is said here once: strings compare and sort by their bytes (SQLite's BINARY; on
PostgreSQL COLLATE "C", whose ILIKE also folds ASCII letters only, as SQLite's LIKE does), and a name glob's
pre-filter (SQLite: the FTS5 trigram table of migration 0005; PostgreSQL: an ILIKE its pg_trgm index serves).
"""

from __future__ import annotations

from typing import Literal, overload

from zoo.columns import BY_NAME
from zoo.errors import SearchSyntaxError
from zoo.query import MAX_COMPARISONS, MAX_DEPTH, And, Compare, Expr, Not, Or, check, parse, parse_sort
from zoo.throughput.measured import MEASURED
from zoo.throughput.roofline import PREDICTED, coefficients

DIALECTS = ("sqlite", "postgresql")
_OPS = ("<", "<=", ">", ">=", "=", "!=")


class Binds:
    """A statement's values, each behind a placeholder: `?` for sqlite3, `:w0`, `:w1`, ... for SQLAlchemy's text()."""

    def __init__(self, named: bool = False):
        self.named = named
        self.values: dict | list = {} if named else []

    def __call__(self, value) -> str:
        if isinstance(self.values, dict):  # named
            key = f"w{len(self.values)}"
            self.values[key] = value
            return f":{key}"
        self.values.append(value)
        return "?"


def like_pattern(glob: str) -> str:
    """A glob as a LIKE pattern with escape character backslash."""
    table = {"*": "%", "?": "_", "%": "\\%", "_": "\\_", "\\": "\\\\"}
    return "".join(table.get(c, c) for c in glob)


def trigram_pattern(glob: str) -> str | None:
    """The LIKE pattern for the trigram pre-filter of a glob on name: its last run of 3 or more plain
    characters, anywhere in the name (a superset of the glob's matches, on the full name or the short one);
    None where the index cannot help. One run, not the whole glob: FTS5 intersects the rows of every trigram,
    and a name's first words (its family, "model", "vit") have hundreds of thousands of rows; its last run
    tends to be the part that tells names apart."""
    runs = [r for r in "".join(" " if c in "*?%_" else c for c in glob).split(" ") if len(r) >= 3]
    return f"%{runs[-1]}%" if runs else None


def _bytewise(sql: str, dialect: str) -> str:
    return f'({sql}) COLLATE "C"' if dialect == "postgresql" else sql


def predicted_sql(field: str) -> str:
    """A predicted field's samples/s (zoo.throughput.roofline.predict from the same coefficients), NULL for a row
    without flops, bytes or activations. A CASE, not AND: PostgreSQL may evaluate an AND's division before its guard.
    The coefficients are the hardware table's, not the user's, and repr(float) is a SQL number."""
    device = PREDICTED[field]
    per_flop, per_activation, per_weight = map(repr, coefficients(device, device.batch))
    compute = f"{per_flop} * models.flops"
    memory = f"{per_activation} * models.train_activation_bytes + {per_weight} * models.bytes"
    return (
        f"CASE WHEN models.flops > 0 AND models.train_activation_bytes > 0 AND models.bytes > 0 "
        f"THEN 1.0 / (CASE WHEN {compute} >= {memory} THEN {compute} ELSE {memory} END) END"
    )


# A stored value that is a finite number. A run put in by hand may hold what zoo never records, and MAX() would
# take it: SQLite keeps text (above every number) and infinity in a REAL column; PostgreSQL's NaN compares above
# every number, infinity included. The bounds are a double's largest, read alike by both backends.
FINITE = "BETWEEN -1.7976931348623157e308 AND 1.7976931348623157e308"


def best_measured_sql(field: str) -> str:
    """A measured field's sort key: the model's best recorded samples/s of that device and mode (its runs of a
    finite number), NULL without one. The device and mode are zoo.throughput.measured's names, not the user's."""
    device, mode = MEASURED[field]
    return (
        f"SELECT MAX(measurements.samples_per_s) FROM measurements WHERE measurements.model_id = models.id "
        f"AND measurements.device = '{device}' AND measurements.mode = '{mode}' "
        f"AND measurements.samples_per_s {FINITE}"
    )


def _glob(e: Compare, value: str, dialect: str, bind: Binds, prefilter) -> str:
    col = f"models.{e.field}"

    def like(sql: str) -> str:
        if dialect == "postgresql":
            return f"{_bytewise(sql, dialect)} ILIKE {bind(like_pattern(value))} ESCAPE '\\'"
        return f"lower({sql}) LIKE lower({bind(like_pattern(value))}) ESCAPE '\\'"

    if e.field != "name":
        return like(col)
    # `name~'vit_*'` also matches timm/vit_base...: globs as timm.list_models takes them. A glob that starts
    # with * matches the short name only if it matches the full one: no OR then.
    pattern = trigram_pattern(value)
    candidates = None
    if pattern is not None and prefilter(pattern):  # a superset of the matches, found fast; the LIKE decides
        candidates = (
            f"models.id IN (SELECT rowid FROM models_fts WHERE models_fts.name LIKE {bind(pattern)})"
            if dialect == "sqlite"
            else f"{_bytewise('models.name', dialect)} ILIKE {bind(pattern.replace(chr(92), chr(92) * 2))}"
        )
    cond = like(col) if value.startswith("*") else f"({like(col)} OR {like('models.short')})"
    return cond if candidates is None else f"({candidates} AND {cond})"


def _compile(e: Expr, negate: bool, depth: int, seen: list[int], dialect: str, bind: Binds, prefilter) -> str:
    # The parser bounds parsed searches; these bound hand-built ones (F) the same way. A parsed search has
    # one level more than its parentheses and `not`s: the top And/Or.
    if depth > MAX_DEPTH + 1:
        raise SearchSyntaxError(f"search nested too deeply: at most {MAX_DEPTH} levels")
    if isinstance(e, Not):
        # `not` is pushed down to the comparisons (De Morgan): every NOT (...) costs SQLite parser stack
        return _compile(e.item, not negate, depth + 1, seen, dialect, bind, prefilter)
    if isinstance(e, (And, Or)):
        join = " AND " if isinstance(e, And) != negate else " OR "
        return "(" + join.join(_compile(i, negate, depth + 1, seen, dialect, bind, prefilter) for i in e.items) + ")"
    if not isinstance(e, Compare):
        raise TypeError(f"not a search expression: {e!r}")
    seen[0] += 1
    if seen[0] > MAX_COMPARISONS:
        raise SearchSyntaxError(f"too many comparisons: at most {MAX_COMPARISONS}")
    value = check(e.field, e.op, e.value)
    if e.field in MEASURED or e.field in PREDICTED:  # false, not NULL, where the row lacks a number: `not` takes it
        # a measured field compares the model's best run, the number its column shows and its sort orders by
        key = best_measured_sql(e.field) if e.field in MEASURED else predicted_sql(e.field)
        cond = f"CASE WHEN ({key}) {e.op} {bind(float(value))} THEN TRUE ELSE FALSE END"
    else:
        col = f"models.{e.field}"
        if e.op == "~":
            assert isinstance(value, str)  # check() refuses a glob on a number field
            cond = _glob(e, value, dialect, bind, prefilter)
        elif isinstance(value, str):
            cond = f"{_bytewise(col, dialect)} {e.op} {bind(value)}"
        else:  # a Python int or float: the driver binds it as 64-bit or float, whatever the column's width
            cond = f"{col} {e.op} {bind(value)}"
        if BY_NAME[e.field].nullable:  # SQL's NULL would make `not task = x` drop rows without a task
            cond = f"({col} IS NOT NULL AND {cond})"
    return f"NOT ({cond})" if negate else cond


@overload
def compile_where(
    expr: str | Expr, dialect: str = ..., prefilter=..., named: Literal[False] = ...
) -> tuple[str, list]: ...
@overload
def compile_where(expr: str | Expr, dialect: str = ..., prefilter=..., *, named: Literal[True]) -> tuple[str, dict]: ...
def compile_where(
    expr: str | Expr, dialect: str = "sqlite", prefilter=lambda pattern: True, named: bool = False
) -> tuple[str, dict | list]:
    """A WHERE clause on the models table and its values (a list for `?`, a dict for `:w0` placeholders);
    prefilter(pattern): whether a name glob gets its trigram pre-filter (all do unless told: it never changes
    which rows match)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {DIALECTS}, not {dialect!r}")
    bind = Binds(named)
    sql = _compile(parse(expr) if isinstance(expr, str) else expr, False, 0, [0], dialect, bind, prefilter)
    return sql, bind.values


def order_sql(order_by: str | None, dialect: str = "sqlite") -> tuple[str, str, bool]:
    """ORDER BY text (rows without a value last, then by name bytewise), the sort field, and whether descending."""
    name = _bytewise("models.name", dialect)
    if not order_by:
        return name, "name", False
    field, descending = parse_sort(order_by)
    if field in PREDICTED:
        key = f"({predicted_sql(field)})"
    elif field in MEASURED:
        key = f"({best_measured_sql(field)})"
    else:
        key = _bytewise(f"models.{field}", dialect) if BY_NAME[field].search_type == "string" else f"models.{field}"
    return f"{key} {'DESC' if descending else 'ASC'} NULLS LAST, {name}", field, descending
