"""Search expressions (zoo.query) as SQLAlchemy clauses on the models table: zoo.registry.where's SQL, for the
backend at hand, values in bound parameters only; and `bytewise`, the string order every backend shares."""

from __future__ import annotations

from sqlalchemy import Boolean, ColumnElement, Text, TextClause, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from zoo.query import Expr, parse_sort
from zoo.registry.where import compile_where, order_sql


class bytewise(FunctionElement):  # noqa: N801 - used like a SQL function
    """A string column compared and ordered by its bytes (code points), as SQLite's BINARY collation does, on
    every backend: a PostgreSQL database's own collation (ICU en-US, say) would order `_b` before `a` and `B`,
    and its ILIKE would fold non-ASCII case, so results would differ from SQLite's."""

    type = Text()
    inherit_cache = True


@compiles(bytewise)
def _bytewise_default(element, compiler, **kw):  # SQLite: BINARY is already bytewise
    return compiler.process(element.clauses, **kw)


@compiles(bytewise, "postgresql")
def _bytewise_postgresql(element, compiler, **kw):
    # "C": bytewise order, and lower() (hence ILIKE) folds ASCII letters only, as SQLite's lower() does
    return f'({compiler.process(element.clauses, **kw)}) COLLATE "C"'


class _Condition(ColumnElement):
    """zoo.registry.where's SQL as a boolean SQLAlchemy clause (a plain text() cannot be negated or combined)."""

    type = Boolean()
    inherit_cache = False  # each search is its own text: nothing to cache
    _is_implicitly_boolean = True

    def __init__(self, clause: TextClause):
        self.clause = clause


@compiles(_Condition)
def _condition(element, compiler, **kw):
    return compiler.process(element.clause, **kw)


def compile_search(expr: str | Expr, dialect: str = "sqlite") -> ColumnElement[bool]:
    """A WHERE clause on Model for a search (text or Expr) on `dialect` ("sqlite" or "postgresql")."""
    sql, values = compile_where(expr, dialect, named=True)
    return _Condition(text(f"({sql})").bindparams(**values))


def sort_clause(spec: str, dialect: str = "sqlite") -> TextClause:
    """ORDER BY for "params" (ascending) or "-params" (descending): rows without a value last, then by name."""
    parse_sort(spec)  # an empty spec is an error here, not the default order
    return text(order_sql(spec, dialect)[0])
