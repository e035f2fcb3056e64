"""Quokka's predicates of 2023 (sqlglot expressions) as polars expressions, to filter each batch.

A `TargetInfo` carries a predicate as a sqlglot tree (`sqlglot.parse_one("l_shipdate <= date
'1998-09-02'")`, `sqlglot.exp.TRUE`, or None for every row). `polars_filter` turns it into one
polars expression: column references (a table qualifier is ignored), string, number, boolean and
NULL literals, `date '...'` and `timestamp '...'` literals (and other casts of literals to those
types), casts of columns to text, integer, floating point, date and timestamp types, comparisons,
AND, OR, NOT, IN and NOT IN over literal lists, BETWEEN, LIKE and ILIKE (`%` and `_`), IS [NOT]
NULL, `+ - * / %`, unary minus, and `interval 'n' day` (days and weeks) in date arithmetic. Any
other form is a `GraphError` that names it, raised while the graph is built, before any work.
AND binds before OR, as the predicate's SQL text says (see `_Translator.connected`).
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable
from typing import Any

from ...graph import GraphError
from .frames import polars_module

SUPPORTED = (
    "columns, literals, date/timestamp literals, casts, = <> < <= > >=, AND, OR, NOT, IN (literals), "
    "BETWEEN, LIKE/ILIKE, IS [NOT] NULL, + - * / %, unary minus, intervals of days or weeks"
)


def sqlglot_module() -> Any:
    """sqlglot, or an ImportError that says how to install it."""
    try:
        import sqlglot
    except ImportError:
        raise ImportError("Quokka's predicates need sqlglot: pip install 'conveyor[quokka]' (or sqlglot)") from None
    return sqlglot


def polars_filter(predicate: Any) -> Any:
    """The polars expression of a Quokka predicate (None: keep every row); a form not supported raises GraphError."""
    pl = polars_module("Quokka's predicates")
    if predicate is None:
        return pl.lit(True)
    exp = sqlglot_module().exp
    if not isinstance(predicate, exp.Expression):
        raise GraphError(
            f"a TargetInfo predicate must be a sqlglot expression (sqlglot.parse_one(...), sqlglot.exp.TRUE) or None, "
            f"got {type(predicate).__name__}"
        )
    return _Translator(pl, exp, predicate).expr(predicate)


class _Translator:
    """One predicate's tree, translated node by node."""

    def __init__(self, pl: Any, exp: Any, whole: Any) -> None:
        self.pl, self.exp, self.whole = pl, exp, whole
        self.binary: dict[type, Callable[[Any, Any], Any]] = {
            exp.EQ: lambda a, b: a == b,
            exp.NEQ: lambda a, b: a != b,
            exp.GT: lambda a, b: a > b,
            exp.GTE: lambda a, b: a >= b,
            exp.LT: lambda a, b: a < b,
            exp.LTE: lambda a, b: a <= b,
            exp.Add: lambda a, b: a + b,
            exp.Sub: lambda a, b: a - b,
            exp.Mul: lambda a, b: a * b,
            exp.Div: lambda a, b: a / b,
            exp.Mod: lambda a, b: a % b,
        }

    def unsupported(self, node: Any, why: str = "") -> GraphError:
        return GraphError(
            f"predicate {self.whole.sql()!r}: {type(node).__name__} ({node.sql()}) is not supported{why}; "
            f"the compat translates {SUPPORTED}"
        )

    def expr(self, node: Any) -> Any:
        exp, pl = self.exp, self.pl
        if isinstance(node, exp.Paren):
            return self.expr(node.this)
        if isinstance(node, exp.Boolean):
            return pl.lit(bool(node.this))
        if isinstance(node, exp.Null):
            return pl.lit(None)
        if isinstance(node, exp.Column):
            return pl.col(node.name)
        if isinstance(node, exp.Literal):
            return pl.lit(self.value(node))
        if isinstance(node, exp.Cast):
            return self.cast(node)
        if isinstance(node, exp.And | exp.Or):
            return self.connected(node)
        if isinstance(node, exp.Neg):
            return -self.expr(node.this)
        if isinstance(node, exp.Not):
            return ~self.expr(node.this)
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self.unsupported(node, " (only IS NULL and IS NOT NULL)")
            return self.expr(node.this).is_null()
        if isinstance(node, exp.Between):
            value = self.expr(node.this)
            return (value >= self.expr(node.args["low"])) & (value <= self.expr(node.args["high"]))
        if isinstance(node, exp.In):
            if node.args.get("query") is not None or node.args.get("unnest") is not None:
                raise self.unsupported(node, " (IN takes a list of literals)")
            return self.expr(node.this).is_in([self.literal(v) for v in node.expressions])
        if isinstance(node, exp.Like | exp.ILike):
            return self.like(node)
        if isinstance(node, exp.Interval):
            return self.interval(node)
        combine = self.binary.get(type(node))
        if combine is None:
            raise self.unsupported(node)
        return combine(self.expr(node.this), self.expr(node.expression))

    def chain(self, node: Any) -> list[Any]:
        """An AND/OR chain written without parentheses, as its text reads: operands with the connectives between them."""
        if isinstance(node, self.exp.And | self.exp.Or):
            return [*self.chain(node.this), type(node), *self.chain(node.expression)]
        return [node]

    def connected(self, node: Any) -> Any:
        """AND before OR, as SQL (and DuckDB, reading `predicate.sql()`) reads the chain's text.

        sqlglot before 25 parsed `a AND b OR c AND d` as `((a AND b) OR c) AND d` (left to right);
        its tree is re-read here, so a predicate means what its SQL says. Parentheses written in
        the text are `Paren` nodes: they stay operands.
        """
        items = self.chain(node)
        groups = [[items[0]]]
        for connective, operand in zip(items[1::2], items[2::2], strict=True):
            if connective is self.exp.Or:
                groups.append([operand])
            else:
                groups[-1].append(operand)
        return functools.reduce(
            lambda a, b: a | b, (functools.reduce(lambda a, b: a & b, (self.expr(o) for o in group)) for group in groups)
        )

    def value(self, node: Any) -> Any:
        """A Literal's Python value: a string, or an int or float."""
        if node.is_string:
            return str(node.this)
        text = str(node.this)
        return float(text) if any(c in text for c in ".eE") else int(text)

    def literal(self, node: Any) -> Any:
        """The Python value of a literal in an IN list (a string, a number, a date, NULL)."""
        exp = self.exp
        if isinstance(node, exp.Paren):
            return self.literal(node.this)
        if isinstance(node, exp.Literal):
            return self.value(node)
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return -self.value(node.this)
        if isinstance(node, exp.Boolean):
            return bool(node.this)
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string:
            return self.temporal(node)
        raise self.unsupported(node, " in an IN list (literals only)")

    def temporal(self, node: Any) -> Any:
        """A cast of a string literal to a date or timestamp, as a Python value."""
        kind = node.to.this
        types = self.exp.DataType.Type
        text = str(node.this.this)
        try:
            if kind == types.DATE:
                return datetime.date.fromisoformat(text.strip())
            if kind in (types.TIMESTAMP, types.DATETIME):
                return datetime.datetime.fromisoformat(text.strip())
        except ValueError:
            raise self.unsupported(node, f" ({text!r} is not an ISO date or timestamp)") from None
        raise self.unsupported(node)

    def cast(self, node: Any) -> Any:
        pl = self.pl
        types = self.exp.DataType.Type
        kind = node.to.this
        if (
            isinstance(node.this, self.exp.Literal)
            and node.this.is_string
            and kind in (types.DATE, types.TIMESTAMP, types.DATETIME)
        ):
            return pl.lit(self.temporal(node))
        targets = {
            types.TEXT: pl.Utf8,
            types.VARCHAR: pl.Utf8,
            types.CHAR: pl.Utf8,
            types.INT: pl.Int64,
            types.BIGINT: pl.Int64,
            types.SMALLINT: pl.Int64,
            types.DOUBLE: pl.Float64,
            types.FLOAT: pl.Float64,
            types.DECIMAL: pl.Float64,
            types.DATE: pl.Date,
            types.TIMESTAMP: pl.Datetime,
            types.DATETIME: pl.Datetime,
            types.BOOLEAN: pl.Boolean,
        }
        if kind not in targets:
            raise self.unsupported(node, f" (a cast to {node.to.sql()})")
        return self.expr(node.this).cast(targets[kind])

    def like(self, node: Any) -> Any:
        pattern = node.expression
        if not (isinstance(pattern, self.exp.Literal) and pattern.is_string):
            raise self.unsupported(node, " (LIKE takes a string literal pattern)")
        if node.args.get("escape") is not None:
            raise self.unsupported(node, " (LIKE ... ESCAPE)")
        regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in str(pattern.this))
        flags = "(?si)" if isinstance(node, self.exp.ILike) else "(?s)"
        return self.expr(node.this).str.contains(f"{flags}^{regex}$")

    def interval(self, node: Any) -> Any:
        unit = node.args.get("unit")
        amount = node.this
        name = unit.name.upper() if unit is not None else ""
        if not isinstance(amount, self.exp.Literal) or name not in ("DAY", "DAYS", "WEEK", "WEEKS"):
            raise self.unsupported(node, " (intervals of days or weeks)")
        days = float(str(amount.this)) * (7 if name.startswith("WEEK") else 1)
        return self.pl.duration(days=days)


__all__ = ["polars_filter"]
