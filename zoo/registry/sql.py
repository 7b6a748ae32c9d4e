"""Search expressions (zoo.query) -> SQLAlchemy clauses on the models table, values in bound parameters only."""

from __future__ import annotations

import operator

from sqlalchemy import (
    BigInteger, Boolean, ColumnElement, Float, String, Text, and_, case, exists, false, literal, not_, or_,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from zoo.errors import SearchSyntaxError
from zoo.measured import MEASURED
from zoo.query import MAX_COMPARISONS, MAX_DEPTH, And, Compare, Expr, Not, Or, check, parse, parse_sort
from zoo.registry.lite import like_pattern, trigram_pattern
from zoo.registry.tables import Measurement, Model
from zoo.roofline import PREDICTED, coefficients

_SQL_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "=": operator.eq, "!=": operator.ne}


class bytewise(FunctionElement):  # noqa: N801 - used like a SQL function
    """A string column compared and ordered by its bytes (code points), as SQLite's BINARY collation does, on
    every backend: a PostgreSQL database's own collation (ICU en-US, say) would order `_b` before `a` and `B`,
    and its ILIKE would fold non-ASCII case, so search results would differ from SQLite's."""

    type = Text()
    inherit_cache = True


@compiles(bytewise)
def _bytewise_default(element, compiler, **kw):  # SQLite: BINARY is already bytewise
    return compiler.process(element.clauses, **kw)


@compiles(bytewise, "postgresql")
def _bytewise_postgresql(element, compiler, **kw):
    # "C": bytewise order, and lower() (hence ILIKE) folds ASCII letters only, as SQLite's lower() does
    return f'({compiler.process(element.clauses, **kw)}) COLLATE "C"'


def _text(col):
    """The column as the search compares it: strings bytewise (see bytewise), numbers as they are."""
    return bytewise(col) if isinstance(col.type, (String, Text)) else col


class name_candidates(FunctionElement):  # noqa: N801 - used like a SQL function
    """A pre-filter for a glob on name: the rows whose name holds the glob's last plain run (see
    zoo.registry.lite.trigram_pattern), a superset of the matches that a trigram index finds fast; the glob's
    own LIKE still decides. SQLite: the FTS5 trigram table of migration 0005. PostgreSQL: an ILIKE its pg_trgm
    index serves (the whole glob's trigrams include a family's common words, with a million rows each).
    Arguments: the pattern as FTS5 reads it (no escapes), and as ILIKE does (backslash escaped)."""

    type = Boolean()
    inherit_cache = True
    _is_implicitly_boolean = True  # a condition as it is: no "= 1" on SQLite, which would hide it from the planner


@compiles(name_candidates)
def _name_candidates_default(element, compiler, **kw):
    return "1 = 1"


@compiles(name_candidates, "sqlite")
def _name_candidates_sqlite(element, compiler, **kw):
    fts = compiler.process(element.clauses.clauses[0], **kw)
    return f"models.id IN (SELECT rowid FROM models_fts WHERE models_fts.name LIKE {fts})"


@compiles(name_candidates, "postgresql")
def _name_candidates_postgresql(element, compiler, **kw):
    return f'(models.name) COLLATE "C" ILIKE {compiler.process(element.clauses.clauses[1], **kw)}'


def _predicted(field: str):
    """(the condition that the row has the numbers, samples/s): zoo.roofline.predict as SQL, from the same
    coefficients (so the two cannot differ)."""
    device = PREDICTED[field]
    per_flop, per_activation, per_weight = (literal(c, Float()) for c in coefficients(device, device.batch))
    compute = per_flop * Model.flops
    memory = per_activation * Model.train_activation_bytes + per_weight * Model.bytes
    has = and_(Model.flops > 0, Model.train_activation_bytes > 0, Model.bytes > 0)
    return has, literal(1.0, Float()) / case((compute >= memory, compute), else_=memory)


def _compile(e: Expr, negate: bool, depth: int, seen: list[int]) -> ColumnElement[bool]:
    # The parser bounds parsed searches; these bound hand-built ones (F) the same way. A parsed
    # search has one level more than its parentheses and `not`s: the top And/Or.
    if depth > MAX_DEPTH + 1:
        raise SearchSyntaxError(f"search nested too deeply: at most {MAX_DEPTH} levels")
    if isinstance(e, Not):
        # `not` is pushed down to the comparisons (De Morgan): every NOT (...) costs SQLite parser stack.
        return _compile(e.item, not negate, depth + 1, seen)
    if isinstance(e, (And, Or)):
        join = and_ if isinstance(e, And) != negate else or_
        return join(*(_compile(i, negate, depth + 1, seen) for i in e.items))
    if not isinstance(e, Compare):
        raise TypeError(f"not a search expression: {e!r}")
    seen[0] += 1
    if seen[0] > MAX_COMPARISONS:
        raise SearchSyntaxError(f"too many comparisons: at most {MAX_COMPARISONS}")
    value = check(e.field, e.op, e.value)
    if e.field in MEASURED:  # any of the model's measurements of that device and mode (zoo.measured)
        device, mode = MEASURED[e.field]
        cond = exists().where(Measurement.model_id == Model.id, Measurement.device == device, Measurement.mode == mode,
                              _SQL_OPS[e.op](Measurement.samples_per_s, literal(value, Float())))
        return not_(cond) if negate else cond
    if e.field in PREDICTED:
        # a CASE, not AND: PostgreSQL may evaluate the division of a row without FLOPs before the AND's guard
        has, speed = _predicted(e.field)
        cond = case((has, _SQL_OPS[e.op](speed, literal(value, Float()))), else_=false())
        return not_(cond) if negate else cond
    col = getattr(Model, e.field)
    if e.op == "~":
        # ilike: SQLite's LIKE ignores ASCII case (only); ILIKE under COLLATE "C" makes PostgreSQL agree.
        cond = _text(col).ilike(like_pattern(value), escape="\\")
        # `name~'vit_*'` also matches timm/vit_base...: globs as timm.list_models takes them. A glob
        # that starts with * matches the short name only if it matches the full one: skip the OR.
        if e.field == "name" and not value.startswith("*"):
            cond = or_(cond, _text(Model.short).ilike(like_pattern(value), escape="\\"))
        if e.field == "name" and (pattern := trigram_pattern(value)) is not None:
            cond = and_(name_candidates(literal(pattern, Text()), literal(pattern.replace("\\", "\\\\"), Text())),
                        cond)
    elif isinstance(value, (int, float)):
        # bound as 64-bit (or float), not as the column's type: PostgreSQL would cast 2**31 to a 32-bit
        # column's INTEGER and fail, where the comparison is simply true or false
        cond = _SQL_OPS[e.op](col, literal(value, BigInteger() if isinstance(value, int) else Float()))
    else:
        cond = _SQL_OPS[e.op](_text(col), value)
    # SQL's NULL would make `not task = x` drop rows without a task; compare as false instead.
    if Model.__table__.c[e.field].nullable:
        cond = and_(col.is_not(None), cond)
    return not_(cond) if negate else cond


def compile_search(expr: str | Expr) -> ColumnElement[bool]:
    """A WHERE clause on Model for a search (text or Expr); values go in bound parameters."""
    return _compile(parse(expr) if isinstance(expr, str) else expr, False, 0, [0])


def sort_clause(spec: str):
    """ORDER BY for "params" (ascending) or "-params" (descending); rows without a value go last."""
    name, descending = parse_sort(spec)
    if name in PREDICTED:
        has, speed = _predicted(name)
        col = case((has, speed))
    else:
        col = _text(getattr(Model, name))
    return (col.desc() if descending else col.asc()).nulls_last()
