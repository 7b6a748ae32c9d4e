"""The search grammar: text or F-expressions -> a validated expression tree. Pure: no registry, no SQL.

A search is a small boolean language over the registry's metadata columns::

    params < 7B and (family = timm or task = image-classification)
    name ~ *vit* and not dtype = float32
    bytes >= 1.5GiB

`parse` turns text into an AST (`Compare`, `And`, `Or`, `Not`); `F` builds the same AST from
Python (``(F.params < 7e9) & F.name.glob("*vit*")``); zoo.registry.where turns either into a WHERE
clause. Every malformed search raises `SearchSyntaxError` with the 1-based column of the offending
token. Comparisons are two-valued: one on a missing value is false, so ``not task = x`` includes
the models without a task.
"""

from __future__ import annotations

import re

from zoo.columns import BY_NAME, PUBLIC
from zoo.columns import SEARCH_FIELDS as FIELDS
from zoo.errors import InvalidArgument, InvalidComparison, SearchSyntaxError
from zoo.records import Record
from zoo.throughput.measured import MEASURED
from zoo.throughput.roofline import PREDICTED

TYPE_CHECKING = False  # typing's, without importing typing: 2 ms of every `zoo search` process
if TYPE_CHECKING:
    from typing import NoReturn

MAX_LENGTH = 10_000  # characters in a search
# Nested parentheses and `not`s. SQLite before 3.46 has a fixed parser stack (100 entries) that
# overflows at about 36 nested `a and (b or (...))`; 25 leaves room for a caller's outer query.
MAX_DEPTH = 25
# SQLite parses `a or b or ...` into a tree as deep as the chain and refuses trees deeper than 1000;
# a comparison on a nullable column costs two levels (col IS NOT NULL AND col op value).
MAX_COMPARISONS = 200

OPS = ("<", "<=", ">", ">=", "=", "!=", "~")  # "==" is read as "="; "~" is a glob match
_OP_TOKENS = ("<=", ">=", "==", "!=", "<", ">", "=", "~")  # longest first
_KEYWORDS = ("and", "or", "not")
_WORD = re.compile(r"[A-Za-z0-9_.\-/*?:+@]+")
_NUMBER = re.compile(
    r"([+-]?(?:[0-9]+(?:_[0-9]+)*(?:\.(?:[0-9]+(?:_[0-9]+)*)?)?|\.[0-9]+(?:_[0-9]+)*)(?:[eE][+-]?[0-9]+)?)"
    r"(k|K|M|G|T|B|kB|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?"
)
_SUFFIXES = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "B": 10**9,  # B: billions ("7B")
             "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}  # fmt: skip
# What a search compares and sorts by: the columns, the predicted fields (zoo.throughput.roofline: computed from a row's
# columns) and the measured ones (zoo.throughput.measured: a model's best recorded run sorts it)
COMPARED = {**FIELDS, **dict.fromkeys(PREDICTED, "number"), **dict.fromkeys(MEASURED, "number")}


def unknown_field(name: str) -> str:
    """What to say of a field that does not exist: the closest names, not all ninety."""
    import difflib

    close = difflib.get_close_matches(str(name).lower(), COMPARED, n=4, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "no field is close to it;"
    return f"unknown field {name!r}; {hint} `zoo search --fields` lists every field"


class Expr:
    """A search expression. Combine with & | ~: Python's and/or/not would silently drop a side."""

    __slots__ = ()

    def __and__(self, other: Expr) -> Expr:
        return _join(And, self, other) if isinstance(other, Expr) else NotImplemented

    def __or__(self, other: Expr) -> Expr:
        return _join(Or, self, other) if isinstance(other, Expr) else NotImplemented

    def __invert__(self) -> Expr:
        return Not(self)

    def __bool__(self):
        raise TypeError("a search expression has no truth value: combine expressions with & | ~, not and/or/not")

    def __str__(self) -> str:
        return _render(self)


class Compare(Expr, Record):
    __slots__ = ("field", "op", "value")
    field: str
    op: str  # one of OPS
    value: int | float | str

    def __init__(self, field: str, op: str, value: int | float | str):
        self._init(field, op, value)


class And(Expr, Record):
    __slots__ = ("items",)
    items: tuple[Expr, ...]

    def __init__(self, items: tuple[Expr, ...]):
        self._init(items)


class Or(Expr, Record):
    __slots__ = ("items",)
    items: tuple[Expr, ...]

    def __init__(self, items: tuple[Expr, ...]):
        self._init(items)


class Not(Expr, Record):
    __slots__ = ("item",)
    item: Expr

    def __init__(self, item: Expr):
        self._init(item)


def _join(cls, *items: Expr) -> Expr:
    # Flat n-ary nodes: a long chain `a and b and c ...` stays one level deep, not one level per term.
    flat: list[Expr] = []
    for item in items:
        flat.extend(item.items if isinstance(item, cls) else (item,))
    return cls(tuple(flat)) if len(flat) > 1 else flat[0]


def _render(e: Expr) -> str:
    """The search text of `e`; parse(str(e)) == e."""
    if isinstance(e, Compare):
        v = e.value
        if not isinstance(v, str):
            text = repr(v)
        elif _WORD.fullmatch(v) and v.lower() not in _KEYWORDS:
            text = v
        else:
            text = "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return f"{e.field} {e.op} {text}"
    if isinstance(e, Not):
        inner = _render(e.item)
        return f"not ({inner})" if isinstance(e.item, (And, Or)) else f"not {inner}"
    if isinstance(e, And):
        return " and ".join(f"({_render(i)})" if isinstance(i, Or) else _render(i) for i in e.items)
    assert isinstance(e, Or), e
    return " or ".join(_render(i) for i in e.items)


def _number(value: object, field: str) -> int | float:
    """A number from Python or from search text ("7B", "1.5GiB", "1_000"); whole numbers become int."""
    from decimal import Decimal, localcontext  # here: a search that compares no number does without it

    if isinstance(value, str):
        m = _NUMBER.fullmatch(value)
        if not m:
            raise InvalidComparison(f"expected a number for {field} (such as 7B, 350M, 1.5GiB, 7e9), got {value!r}")
        try:  # exact: rounding could make 1.000...1 whole
            with localcontext(prec=len(value) + 20):
                d = Decimal(m[1].replace("_", "")) * _SUFFIXES.get(m[2], 1)
        except ArithmeticError:  # an exponent too large even for Decimal
            raise InvalidComparison(f"number out of range for {field}: {value!r}") from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        d = Decimal(value)
    else:
        raise InvalidComparison(f"{field} is a number field: expected a number, got {value!r}")
    if not d.is_finite() or (d and not -300 <= d.adjusted() <= 300):
        raise InvalidComparison(f"number out of range for {field}: {value!r}")
    # Whole numbers past 64 bits stay float: SQLite cannot bind larger ints.
    return int(d) if d == d.to_integral_value() and abs(d) < 2**63 else float(d)


def check(field: str, op: str, value: object) -> int | float | str:
    """Validate one comparison; returns the value to compare with."""
    if field not in COMPARED:
        raise InvalidComparison(unknown_field(field))
    if op not in OPS:
        raise InvalidComparison(f"unknown operator {op!r}; operators are: {' '.join(OPS)}", at_op=True)
    if COMPARED[field] == "number":
        if op == "~":
            raise InvalidComparison(f"'~' (glob) works on string fields only, and {field} is a number", at_op=True)
        return _number(value, field)
    if not isinstance(value, str):
        raise InvalidComparison(f"{field} is a string field: expected a string, got {value!r}")
    if op == "~" and "[" in value:
        raise InvalidComparison("character classes ([...]) are not supported in globs: use * and ?")
    return value


class _Field:
    """`F.params`: comparisons on it build `Compare` nodes."""

    __slots__ = ("name",)
    __hash__ = None  # type: ignore[assignment]  # unhashable on purpose: __eq__ builds an expression

    def __init__(self, name: str):
        self.name = name

    def _compare(self, op: str, value: object) -> Compare:
        return Compare(self.name, op, check(self.name, op, value))

    def __lt__(self, value): return self._compare("<", value)  # fmt: skip

    def __le__(self, value): return self._compare("<=", value)  # fmt: skip

    def __gt__(self, value): return self._compare(">", value)  # fmt: skip

    def __ge__(self, value): return self._compare(">=", value)  # fmt: skip

    def __eq__(self, value): return self._compare("=", value)  # fmt: skip

    def __ne__(self, value): return self._compare("!=", value)  # fmt: skip

    def glob(self, pattern: str) -> Compare:
        """Case-insensitive (ASCII) match: * is any run of characters, ? is one."""
        return self._compare("~", pattern)

    def __repr__(self) -> str:
        return f"F.{self.name}"


class _Fields:
    """`F.params < 7e9`, `F.name.glob("*vit*")`: search expressions from Python."""

    __slots__ = ()

    def __getattr__(self, name: str) -> _Field:
        if name.lower() in COMPARED:
            return _Field(name.lower())
        raise AttributeError(unknown_field(name).replace("unknown field", "no search field", 1))

    def __dir__(self):
        return list(COMPARED)


F = _Fields()


class _Token:
    __slots__ = ("kind", "text", "col")

    def __init__(self, kind: str, text: str, col: int):
        self.kind = kind  # "word", "string", "op", "(", ")" or "end"
        self.text = text  # as written; a string's content without quotes and escapes
        self.col = col  # 1-based


def _describe(tok: _Token) -> str:
    return {"end": "the end of the search", "string": f"the string {tok.text!r}"}.get(tok.kind, repr(tok.text))


def _tokenize(text: str) -> list[_Token]:
    tokens, i = [], 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "()":
            tokens.append(_Token(c, c, i + 1))
            i += 1
        elif c in "'\"":
            # Backslash escapes only the quote and itself, so Windows paths need no doubling.
            out, j = [], i + 1
            while j < len(text) and text[j] != c:
                if text[j] == "\\" and j + 1 < len(text) and text[j + 1] in (c, "\\"):
                    j += 1
                out.append(text[j])
                j += 1
            if j >= len(text):
                raise SearchSyntaxError(f"unterminated string: expected a closing {c}", text, i + 1)
            tokens.append(_Token("string", "".join(out), i + 1))
            i = j + 1
        elif m := _WORD.match(text, i):
            tokens.append(_Token("word", m[0], i + 1))
            i = m.end()
        elif op := next((o for o in _OP_TOKENS if text.startswith(o, i)), None):
            tokens.append(_Token("op", op, i + 1))
            i += len(op)
        else:
            raise SearchSyntaxError(
                f"unexpected character {c!r}: expected a field, operator, value, parenthesis or quote", text, i + 1
            )
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


class _Parser:
    """Recursive descent; precedence not > and > or."""

    def __init__(self, text: str):
        self.text, self.tokens, self.pos = text, _tokenize(text), 0
        self.depth = self.comparisons = 0

    def fail(self, message: str, tok: _Token) -> NoReturn:
        raise SearchSyntaxError(message, self.text, tok.col)

    def next(self) -> _Token:
        tok = self.tokens[self.pos]
        self.pos += tok.kind != "end"
        return tok

    def keyword(self, word: str) -> bool:
        tok = self.tokens[self.pos]
        if tok.kind == "word" and tok.text.lower() == word:
            self.pos += 1
            return True
        return False

    def parse(self) -> Expr:
        if self.tokens[0].kind == "end":
            self.fail("empty search: expected a comparison such as 'params < 7B'", self.tokens[0])
        expr = self.or_()
        tok = self.tokens[self.pos]
        if tok.kind != "end":
            self.fail(f"unexpected {_describe(tok)}: expected 'and', 'or' or the end of the search", tok)
        return expr

    def or_(self) -> Expr:
        items = [self.and_()]
        while self.keyword("or"):
            items.append(self.and_())
        return _join(Or, *items)

    def and_(self) -> Expr:
        items = [self.unary()]
        while self.keyword("and"):
            items.append(self.unary())
        return _join(And, *items)

    def unary(self) -> Expr:
        tok = self.tokens[self.pos]
        is_not = tok.kind == "word" and tok.text.lower() == "not"
        if tok.kind != "(" and not is_not:
            return self.comparison()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"search nested too deeply: at most {MAX_DEPTH} levels of parentheses and 'not'", tok)
        self.pos += 1
        expr: Expr
        if is_not:
            expr = Not(self.unary())
        else:
            expr = self.or_()
            close = self.next()
            if close.kind != ")":
                self.fail(f"expected ')' to close the '(' at column {tok.col}, got {_describe(close)}", close)
        self.depth -= 1
        return expr

    def comparison(self) -> Compare:
        field = self.next()
        if field.kind != "word" or field.text.lower() in _KEYWORDS:
            self.fail(f"expected a comparison (a field such as 'params', '(' or 'not'), got {_describe(field)}", field)
        name = field.text.lower()
        if name not in COMPARED:
            self.fail(unknown_field(field.text), field)
        op = self.next()
        if op.kind != "op":
            self.fail(f"expected an operator ({' '.join(_OP_TOKENS)}) after {field.text!r}, got {_describe(op)}", op)
        value = self.next()
        if value.kind not in ("word", "string") or (value.kind == "word" and value.text.lower() in _KEYWORDS):
            hint = f" (quote it, '{value.text}', to compare with the word)" if value.kind == "word" else ""
            self.fail(f"expected a value after {op.text!r}, got {_describe(value)}{hint}", value)
        self.comparisons += 1
        if self.comparisons > MAX_COMPARISONS:
            self.fail(f"too many comparisons: at most {MAX_COMPARISONS}", field)
        op_text = "=" if op.text == "==" else op.text
        try:
            checked = check(name, op_text, value.text)
        except InvalidComparison as e:
            bad = e
        else:
            return Compare(name, op_text, checked)
        self.fail(bad.message, op if bad.at_op else value)


def parse(text: str) -> Expr:
    """Parse a search; raises SearchSyntaxError (with a column) on anything malformed, "" included."""
    if not isinstance(text, str):
        raise TypeError(f"a search is a str, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise SearchSyntaxError(f"search too long: {len(text)} characters, at most {MAX_LENGTH}", "", MAX_LENGTH + 1)
    return _Parser(text).parse()


def parse_sort(spec: str) -> tuple[str, bool]:
    """(field, descending) for "params" (ascending) or "-params" (descending)."""
    text = spec.strip()
    descending = text.startswith("-")
    name = text[1:] if descending else text
    if name.lower() not in COMPARED:
        column = len(spec) - len(spec.lstrip()) + 1 + descending
        raise SearchSyntaxError(f"cannot sort by {name!r}: expected one of {', '.join(COMPARED)}", spec, column)
    return name.lower(), descending


def check_fields(fields) -> tuple[str, ...]:
    """Zoo.search's `fields` as a tuple: field names in any iterable but a string (whose letters it would be),
    each a public column or a field the search computes (a predicted or a measured one)."""
    try:
        names = None if isinstance(fields, (str, bytes)) else tuple(fields)
    except TypeError:
        names = None
    if names is None or not all(isinstance(f, str) for f in names):
        raise InvalidArgument(
            f"fields is a tuple of field names, e.g. ('name', 'params', 'bench_cpu'), not {fields!r:.80}"
        )
    unknown = [f for f in names if not (f in BY_NAME and BY_NAME[f].public or f in MEASURED or f in PREDICTED)]
    if unknown:
        raise InvalidArgument(
            f"unknown fields {unknown}; fields are {', '.join(c.name for c in PUBLIC)}, "
            f"{', '.join(MEASURED)} (measured) and {', '.join(PREDICTED)} (predicted)"
        )
    return names
