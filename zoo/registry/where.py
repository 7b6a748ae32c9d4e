"""The one compiler of a search (zoo.query's tree) to SQL: a WHERE clause and an ORDER BY, as text with every
value of the search in a bound parameter. Both readers use it: zoo.registry.sql wraps it for SQLAlchemy
(SQLite and PostgreSQL), zoo.registry.lite runs it through the standard sqlite3 module. Pure: it imports
neither SQLAlchemy nor torch.

What differs by backend is said here once: strings compare and sort by their bytes (SQLite's BINARY; on
PostgreSQL COLLATE "C", whose ILIKE also folds ASCII letters only, as SQLite's LIKE does), and a name glob's
pre-filter (SQLite: the FTS5 trigram table of migration 0005; PostgreSQL: an ILIKE its pg_trgm index serves).
"""

from __future__ import annotations

import functools

from zoo.columns import BY_NAME
from zoo.errors import SearchSyntaxError
from zoo.query import MAX_COMPARISONS, MAX_DEPTH, And, Compare, Expr, Not, Or, check, parse, parse_sort
from zoo.throughput.measured import MEASURED
from zoo.throughput.roofline import PREDICTED, coefficients

TYPE_CHECKING = False  # typing's, without importing typing: 2 ms of every `zoo search` process
if TYPE_CHECKING:
    from typing import Literal, overload

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


def _like(sql: str, glob: str, dialect: str, bind: Binds) -> str:
    """The glob's test: ASCII letters in either case match (SQLite's lower(), PostgreSQL's ILIKE under "C")."""
    if dialect == "postgresql":
        return f"{_bytewise(sql, dialect)} ILIKE {bind(like_pattern(glob))} ESCAPE '\\'"
    return f"lower({sql}) LIKE lower({bind(like_pattern(glob))}) ESCAPE '\\'"


def _glob(e: Compare, value: str, dialect: str, bind: Binds, prefilter) -> str:
    col = f"models.{e.field}"

    def like(sql: str) -> str:
        return _like(sql, value, dialect, bind)

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


if TYPE_CHECKING:

    @overload
    def compile_where(
        expr: str | Expr, dialect: str = ..., prefilter=..., named: Literal[False] = ...
    ) -> tuple[str, list]: ...
    @overload
    def compile_where(
        expr: str | Expr, dialect: str = ..., prefilter=..., *, named: Literal[True]
    ) -> tuple[str, dict]: ...


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
    return f"{_sort_key(field, dialect)} {'DESC' if descending else 'ASC'} NULLS LAST, {name}", field, descending


def _sort_key(field: str, dialect: str) -> str:
    if field in PREDICTED:
        return f"({predicted_sql(field)})"
    if field in MEASURED:
        return f"({best_measured_sql(field)})"
    return _bytewise(f"models.{field}", dialect) if BY_NAME[field].search_type == "string" else f"models.{field}"


# --- a name glob's literal prefix as index ranges ------------------------------------------------------------------
# `name~'timm/*'` matches a quarter of a million models, contiguous in name order, yet its LIKE (case-folding, on
# the full name or the short one) can use no index but the trigram one, which hands over all of them unordered:
# 0.3-0.6 s to sort them for the first 100. The rows whose name starts with the prefix are index ranges instead,
# one per way of writing its letters that some name starts with (found by seeking the index: nearly always one),
# read in the search's order; the same for the short name; the first `limit` of their union are the search's.


def literal_prefix(glob: str) -> str:
    """What every match of a glob starts with: its characters up to the first wildcard."""
    return glob[: min((i for i in (glob.find("*"), glob.find("?")) if i >= 0), default=len(glob))]


def _spellings(prefix: str) -> list[str]:
    """Each character of a prefix as the characters that match it, in byte order: the search folds ASCII letters
    only (SQLite's lower(), PostgreSQL's ILIKE under "C"), so 't' -> 'Tt', '/' -> '/'."""
    return ["".join(sorted({c.upper(), c.lower()})) if c.isascii() and c.isalpha() else c for c in prefix]


def _next_spelling(options: list[str], after: str) -> str | None:
    """The smallest string of one character from each of options (sorted) greater than `after`, or None."""
    for i in range(min(len(after), len(options) - 1), -1, -1):
        if any(after[j] not in options[j] for j in range(i)):
            continue
        if i == len(after):  # `after` is a prefix of every string that keeps it
            return after + "".join(o[0] for o in options[i:])
        bigger = [c for c in options[i] if c > after[i]]
        if bigger:
            return after[:i] + bigger[0] + "".join(o[0] for o in options[i + 1 :])
    return None


def _after_all(prefix: str) -> str:
    """The smallest string above every string that starts with `prefix` (ASCII)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


_MOST_SPELLINGS = 8  # more, and the ranges do not pay: the caller searches as it would without them


def spellings_present(prefix: str, seek) -> list[str] | None:
    """The ways of writing `prefix` (letters in either case) that start at least one value of an indexed column, in
    byte order, found by seeking (seek(x): the column's smallest value >= x, bytewise, or None); None past
    _MOST_SPELLINGS of them or as many seeks."""
    options, found = _spellings(prefix), list[str]()
    at: str | None = "".join(o[0] for o in options)
    for _ in range(4 * _MOST_SPELLINGS):
        value = None if at is None else seek(at)
        if value is None:
            return found
        head = value[: len(prefix)]
        if len(head) == len(prefix) and all(c in o for c, o in zip(head, options)):
            found.append(head)
            if len(found) > _MOST_SPELLINGS:
                return None
            at = _after_all(head)
        else:
            at = _next_spelling(options, head)
    return None


def seek_sql(column: str, dialect: str = "sqlite", named: bool = False) -> str:
    """The statement spellings_present seeks with: a column's smallest value at or above one bound value."""
    col = _bytewise(f"models.{column}", dialect)
    return f"SELECT models.{column} FROM models WHERE {col} >= {':v' if named else '?'} ORDER BY {col} LIMIT 1"


def _prefix_glob(expr: Expr) -> tuple[Compare, list[Expr]] | None:
    """The first name glob with a literal prefix among the search's top-level conjuncts, and the other conjuncts."""
    items = list(expr.items) if isinstance(expr, And) else [expr]
    for i, item in enumerate(items):
        if isinstance(item, Compare) and item.field == "name" and item.op == "~":
            value = check(item.field, item.op, item.value)
            if isinstance(value, str) and literal_prefix(value) and literal_prefix(value).isascii():
                return item, items[:i] + items[i + 1 :]
    return None


def first_ids(
    expression: str | Expr, order_by: str | None, limit: int, dialect: str = "sqlite", named: bool = False, seek=None
) -> tuple[str, dict | list] | None:
    """The ids of a search's first `limit` rows, a name glob's prefix read as index ranges (see above): one
    statement and its values; None where the search has no such glob, or its prefix too many spellings (then
    the caller runs its own). seek(column, x): the smallest value of name or short >= x, bytewise (seek_sql)."""
    expr = parse(expression) if isinstance(expression, str) else expression
    found = _prefix_glob(expr)
    if found is None:
        return None
    glob, rest = found
    value = str(check(glob.field, glob.op, glob.value))
    prefix = literal_prefix(value)
    # as _glob: a glob that does not start with * also matches the short name
    heads = {c: spellings_present(prefix, functools.partial(seek, c)) for c in ("name", "short")}
    if any(h is None for h in heads.values()):
        return None
    bind = Binds(named)
    order, field, descending = order_sql(order_by, dialect)
    name = _bytewise("models.name", dialect)
    branches: list[str] = []
    for column, spellings in heads.items():
        col = _bytewise(f"models.{column}", dialect)
        for head in spellings or ():
            cond = f"{col} >= {bind(head)} AND {col} < {bind(_after_all(head))}"
            if value != prefix + "*":  # `timm/*`: every name in the range matches, and no LIKE is needed
                # `|| ''`: the LIKE is no expression the trigram index serves, so PostgreSQL reads the range (its
                # planner took that index for `hf/model_00001%` once, 50 ms of common trigrams for 53 rows).
                # Where the range says it all, none: PostgreSQL cannot tell how many rows pass such a LIKE, takes
                # it for a few, and read the whole table for the first 150 of `timm/*` (300 ms), not the range.
                cond += " AND " + _like(f"(models.{column} || '')", value, dialect, bind)
            if rest:
                cond += " AND " + _compile(And(tuple(rest)), False, 0, [0], dialect, bind, lambda pattern: False)
            branches.append(
                f"SELECT * FROM (SELECT models.id AS id, {_sort_key(field, dialect)} AS k, {name} AS n FROM models "
                f"WHERE {cond} ORDER BY {order} LIMIT {bind(limit)}) AS b{len(branches)}"
            )
    if not branches:  # no name starts with the prefix, in any spelling
        return "SELECT models.id FROM models WHERE 1 = 0", bind.values
    union = " UNION ".join(branches)  # UNION, not ALL: a row whose name and short name both match is one row
    direction = "DESC" if descending else "ASC"
    return (
        f"SELECT first.id FROM ({union} ORDER BY k {direction} NULLS LAST, n LIMIT {bind(limit)}) AS first",
        bind.values,
    )


# --- a number sort's first rows on PostgreSQL, read in the sort's index -------------------------------------------
# PostgreSQL puts NULLs last ascending and first descending; the search puts rows without a value last either way,
# so no index serves a descending sort as written: 43,000 matches of a params range sorted by -flops were read and
# sorted for the first 100 (40 ms at a million models). Read in the index instead (the rows with a value, then those
# without), the first 100 matches come after about 2,300 rows. But the planner assumes the matches are spread evenly
# through any order, and a sort field that runs with the filtered one (bytes, for a params range) puts them behind
# 380,000 rows that do not match: so each read has a budget of rows, as zoo.registry.lite's in-order scan has, and
# one that runs past it starts again from where the matches start in the sort order (their largest or smallest
# value). Whatever runs past its budget twice, or is short of `limit` rows, is the caller's ordinary statement.


def _own_range(expr: Expr, field: str) -> Expr | None:
    """The search's top-level comparisons of `field` with a number (an index range on it), or None."""
    items = expr.items if isinstance(expr, And) else (expr,)
    own = tuple(i for i in items if isinstance(i, Compare) and i.field == field and i.op in ("<", "<=", ">", ">=", "="))
    return None if not own else own[0] if len(own) == 1 else And(own)


def in_order_sql(expression: str | Expr, order_by: str, limit: int, budget: int, start=None) -> tuple[str, dict]:
    """The ids of a search's first `limit` matches among the first `budget` rows with a value of its (number) sort
    field in the sort's order (from `start` on: the matches' first value), on PostgreSQL: a statement and its values.
    Fewer than `limit` ids: the budget ran out first, or fewer rows with a value match."""
    expr = parse(expression) if isinstance(expression, str) else expression
    field, descending = parse_sort(order_by)
    bind, col, name = Binds(named=True), f"models.{field}", _bytewise("models.name", "postgresql")
    hit = _compile(expr, False, 0, [0], "postgresql", bind, lambda pattern: False)
    scan = [f"{col} IS NOT NULL"]  # the rows without a value come after every row with one
    own = _own_range(expr, field)
    if own is not None:  # a range on the sort field is where the scan starts and ends
        scan.append(_compile(own, False, 0, [0], "postgresql", bind, lambda pattern: False))
    if start is not None:
        scan.append(f"{col} {'<=' if descending else '>='} {bind(start)}")
    # DESC, not DESC NULLS LAST: the rows are those with a value, and so the index read backwards serves it
    direction = "DESC" if descending else "ASC"
    assert isinstance(bind.values, dict)  # named
    return (
        f"SELECT scanned.id FROM (SELECT models.id AS id, {col} AS k, {name} AS n, ({hit}) AS hit FROM models "
        f"WHERE {' AND '.join(scan)} ORDER BY {col} {direction}, {name} LIMIT {bind(budget)}) AS scanned "
        f"WHERE scanned.hit ORDER BY scanned.k {direction}, scanned.n LIMIT {bind(limit)}",
        bind.values,
    )


def start_sql(expression: str | Expr, order_by: str) -> tuple[str, dict]:
    """The first value of a search's (number) sort field among its matches, and how many match, on PostgreSQL.
    `+ 0`: max() of an indexed column is otherwise read in its index, the very scan that missed the matches."""
    expr = parse(expression) if isinstance(expression, str) else expression
    field, descending = parse_sort(order_by)
    bind = Binds(named=True)
    where = _compile(expr, False, 0, [0], "postgresql", bind, lambda pattern: True)
    first = "max" if descending else "min"
    assert isinstance(bind.values, dict)  # named
    return f"SELECT {first}(models.{field} + 0), count(*) FROM models WHERE {where}", bind.values
