"""The rows a table's constraints refuse, set apart in the tasks before any table takes them.

Delta enforces a table's NOT NULL columns and its CHECK constraints (`delta.constraints.<name>` in its configuration:
a Spark SQL boolean expression) on every row written. lakefeed's tasks write the tables' files themselves, so they
apply them: a row with a null in a NOT NULL column, or for which a CHECK is not true, is quarantined with the
constraint it breaks. As delta-spark's CheckDeltaInvariant, a CHECK passes a row only when it is true: false or
null refuse it, and so does an error evaluating it (an overflow, a division by zero: Spark's ANSI mode fails the
write). lakefeed evaluates every part of the expression for every row, so an error anywhere refuses the row, where
Spark may skip the part that fails (`x = 0 OR y / x > 1`: a short-circuit; `0.5 = -a`: false whatever `a` is, so
folded): such a row is quarantined, never lost.

A CHECK is parsed with sqlglot (Spark's dialect) and evaluated over the rows with Arrow's kernels, as Spark does:
- columns (top-level; matched by name, else by name without case, as Spark resolves them), literals (numbers,
  strings, TRUE/FALSE, NULL, DATE '...', TIMESTAMP '...');
- `= == <> != < <= > >= <=>` (NaN equal to NaN and above every number, as in Spark), AND, OR, NOT (three-valued),
  IS [NOT] NULL, [NOT] IN (...), [NOT] BETWEEN, [NOT] LIKE / ILIKE with a literal pattern;
- `+ - *` and unary minus (checked: an overflow refuses the row), `/` (as Spark, in doubles) and `%` (not of
  decimals); a string compared with a date or a timestamp is read as one (in UTC, lakefeed's Spark time zone);
- length / char_length / character_length, lower, upper, abs, coalesce.
Anything else (another function, a subquery, a nested field, a comparison of a string with a number, ...) is
`Unsupported`, found when the batch is planned: an append entity's table takes no files from lakefeed until the
constraint is dropped or changed; a keyed entity leaves it to its MERGE (connectors/sinks/constraints.py).
tests/test_checks.py compares this with Spark's own evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from lakefeed.batch.cdc import KIND, bad_reasons, writes_rows
from lakefeed.batch.read import BadRow
from lakefeed.config.model import CdcConfig

Checks = tuple[tuple[str, str], ...]  # a table's CHECK constraints: (name, expression), by name
Value = pa.Array | pa.ChunkedArray | pa.Scalar


class Unsupported(ValueError):  # noqa: N818 (what the expression is to lakefeed)
    """A CHECK constraint lakefeed cannot evaluate as Spark would."""


class Check:
    """One CHECK constraint, parsed and checked against the table's schema."""

    def __init__(self, name: str, expression: str, schema: pa.Schema) -> None:
        self.name, self.expression, self._schema = name, expression, schema
        try:
            self._tree = sqlglot.parse_one(expression, read="spark").transform(_negations)
        except sqlglot.errors.ParseError as e:
            raise Unsupported(f"CHECK constraint {name} ({expression}) does not parse: {e}") from None
        try:
            kind = _Evaluation(schema.empty_table(), schema).value(self._tree).type
        except ArithmeticError as e:
            raise Unsupported(f"CHECK constraint {name} ({expression}) fails whatever the row: {e}") from None
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise Unsupported(f"CHECK constraint {name} ({expression}) compares or combines values of types "
                              f"lakefeed does not: {e}") from None
        except Unsupported as e:
            raise Unsupported(f"CHECK constraint {name} ({expression}): {e}") from None
        if kind not in (pa.bool_(), pa.null()):
            raise Unsupported(f"CHECK constraint {name} ({expression}) is not a condition: it gives {kind}")

    def passes(self, data: pa.Table) -> np.ndarray:
        """Whether each row passes (True only where the expression is true); a row whose evaluation fails (an
        overflow, a division by zero) does not."""
        try:
            return self._true(data)
        except (pa.ArrowInvalid, ArithmeticError):
            if data.num_rows == 1:
                return np.zeros(1, dtype=bool)
        half = data.num_rows // 2  # the rare batch with such a row: found by halves, the rest evaluated as one
        return np.concatenate([self.passes(data.slice(0, half)), self.passes(data.slice(half))])

    def _true(self, data: pa.Table) -> np.ndarray:
        value = _Evaluation(data, self._schema).value(self._tree)
        if isinstance(value, pa.Scalar):
            return np.full(data.num_rows, value.as_py() is True)
        return pc.fill_null(value.cast(pa.bool_()), False).to_numpy(zero_copy_only=False).astype(bool)


def compiled(checks: Checks, schema: pa.Schema) -> list[Check]:
    """The table's CHECK constraints, each ready to evaluate; raises Unsupported for one lakefeed cannot."""
    return [Check(name, expression, schema) for name, expression in checks]


def refused(data: pa.Table, target: pa.Schema | None, checks: Checks,
            cdc: CdcConfig) -> tuple[pa.Table, list[tuple[str, BadRow]]]:
    """The rows the table (its schema `target`, its CHECK constraints `checks`) can take, and the others
    quarantined, each naming the first constraint it breaks. A keyed entity's rows (`__kind`) are left to its MERGE
    for NOT NULL; those that write no row (deletes, an update's before-image) are not checked at all."""
    if target is None or not data.num_rows:
        return data, []
    reasons: dict[int, str] = {}
    keyed = KIND in data.column_names
    for field in () if keyed else (f for f in target if not f.nullable):
        empty = (pc.is_null(data.column(field.name)).to_numpy(zero_copy_only=False) if field.name in data.column_names
                 else np.ones(data.num_rows, dtype=bool))
        for i in np.flatnonzero(empty):
            reasons.setdefault(int(i), f"column {field.name!r} is NOT NULL in the table, and the row has no value "
                                       "there")
    writes = writes_rows(data, cdc) if keyed else np.ones(data.num_rows, dtype=bool)
    for check in compiled(checks, target):
        for i in np.flatnonzero(writes & ~check.passes(data)):
            reasons.setdefault(int(i), f"breaks the table's CHECK constraint {check.name} ({check.expression})")
    if not reasons:
        return data, []
    keep = np.ones(data.num_rows, dtype=bool)
    keep[list(reasons)] = False
    return data.filter(pa.array(keep)), bad_reasons(data, reasons)


_COMPARE = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.LT: "less", exp.LTE: "less_equal", exp.GT: "greater",
            exp.GTE: "greater_equal"}
# What a comparison gives when NaN is on one side or both (Spark orders NaN above every number, equal to itself):
# (both NaN, only the left, only the right).
_NAN = {"equal": (True, False, False), "not_equal": (False, True, True), "less": (False, False, True),
        "less_equal": (True, False, True), "greater": (False, True, False), "greater_equal": (True, True, False)}
_ARITHMETIC = {exp.Add: "add_checked", exp.Sub: "subtract_checked", exp.Mul: "multiply_checked"}
_TEXT = {exp.Lower: "utf8_lower", exp.Upper: "utf8_upper"}


class _Evaluation:
    """An expression's value over `data`, whose columns are read as `schema` has them (a column the rows lack is
    null)."""

    def __init__(self, data: pa.Table, schema: pa.Schema) -> None:
        self._data, self._schema = data, schema

    def value(self, node: exp.Expression) -> Value:  # noqa: PLR0911, PLR0912 - one case per kind of node
        v = self.value
        if isinstance(node, exp.Paren):
            return v(node.this)
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
            return _literal(node)
        if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.to.is_type("date"):
            return pa.scalar(node.this.this).cast(pa.date32())
        if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.to.is_type("timestamptz"):
            return _timestamp(node.this.this, pa.timestamp("us", "UTC"))
        if isinstance(node, exp.And):
            return pc.and_kleene(*_logical(v(node.this), v(node.expression)))
        if isinstance(node, exp.Or):
            return pc.or_kleene(*_logical(v(node.this), v(node.expression)))
        if isinstance(node, exp.Not):
            return pc.invert(_logical(v(node.this))[0])
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            return pc.is_null(v(node.this))
        if type(node) in _COMPARE:
            return _compare(_COMPARE[type(node)], v(node.this), v(node.expression))
        if isinstance(node, exp.NullSafeEQ):
            left, right = _paired(v(node.this), v(node.expression))
            both = pc.and_(pc.is_null(left), pc.is_null(right))
            return pc.or_(both, pc.fill_null(_compare("equal", left, right), False))
        if isinstance(node, exp.In) and node.expressions and not node.args.get("query"):
            this, out = v(node.this), pa.scalar(False)
            for item in node.expressions:
                out = pc.or_kleene(out, _compare("equal", this, v(item)))
            return out
        if isinstance(node, exp.Between):
            this = v(node.this)
            return pc.and_kleene(_compare("greater_equal", this, v(node.args["low"])),
                                 _compare("less_equal", this, v(node.args["high"])))
        if isinstance(node, (exp.Like, exp.ILike)) and isinstance(node.expression, exp.Literal):
            return pc.match_like(_text(v(node.this)), node.expression.this, ignore_case=isinstance(node, exp.ILike))
        if type(node) in _ARITHMETIC:
            return _arithmetic(_ARITHMETIC[type(node)], v(node.this), v(node.expression))
        if isinstance(node, exp.Div):
            return _divide(v(node.this), v(node.expression))
        if isinstance(node, exp.Mod):
            return _remainder(v(node.this), v(node.expression), self._data.num_rows)
        if isinstance(node, exp.Neg):
            return _numeric(pc.negate_checked, v(node.this))
        if isinstance(node, exp.Abs):
            return _numeric(pc.abs_checked, v(node.this))
        if isinstance(node, exp.Length):
            return pc.utf8_length(_text(v(node.this)))
        if type(node) in _TEXT:
            return getattr(pc, _TEXT[type(node)])(_text(v(node.this)))
        if isinstance(node, exp.Coalesce):
            values = [v(node.this), *(v(e) for e in node.expressions)]
            kind = _common([x.type for x in values])
            return pc.coalesce(*(x.cast(kind, safe=False) for x in values))
        raise Unsupported(f"lakefeed does not evaluate {node.sql(dialect='spark')!r} ({type(node).__name__})")

    def _column(self, node: exp.Column) -> Value:
        if node.table or not isinstance(node.this, exp.Identifier):
            raise Unsupported(f"lakefeed evaluates top-level columns only, not {node.sql(dialect='spark')!r}")
        name = node.name
        names = self._schema.names
        if name not in names:
            same = [n for n in names if n.lower() == name.lower()]
            if len(same) != 1:
                raise Unsupported(f"column {name!r} is not one of the table's")
            name = same[0]
        kind = self._schema.field(name).type
        if name not in self._data.column_names:
            return pa.nulls(self._data.num_rows, kind)
        return self._data.column(name).cast(kind)


def _negations(node: exp.Expression) -> exp.Expression:
    """`x NOT LIKE p` (sqlglot: a LIKE marked negated; IN and BETWEEN too) as NOT (x LIKE p)."""
    if not node.args.get("negate"):
        return node
    plain = node.copy()
    plain.set("negate", False)
    return exp.Not(this=plain)


def _literal(node: exp.Expression) -> pa.Scalar:
    if isinstance(node, exp.Null):
        return pa.scalar(None)
    if isinstance(node, exp.Boolean):
        return pa.scalar(bool(node.this))
    if node.is_string:
        return pa.scalar(node.this, pa.string())
    text = node.this
    if "e" in text.lower():
        return pa.scalar(float(text), pa.float64())
    if "." in text:  # a decimal, as Spark types it: 0.1 * 3 = 0.3 exactly
        return pa.scalar(Decimal(text))
    number = int(text)
    return pa.scalar(number, pa.int32() if -(2 ** 31) <= number < 2 ** 31 else pa.int64())  # as Spark types it


def _logical(*values: Value) -> list[Value]:
    """Operands of AND, OR, NOT: conditions (NULL as an unknown one); `NOT a` of a number is no condition to Spark."""
    for x in values:
        if x.type not in (pa.bool_(), pa.null()):
            raise Unsupported(f"AND, OR and NOT take conditions, not {x.type}")
    return [x.cast(pa.bool_()) if x.type == pa.null() else x for x in values]


def _paired(left: Value, right: Value) -> tuple[Value, Value]:
    """The two sides of a comparison in types Arrow compares: a NULL literal as the other side's type, a string
    literal against a date as a date (as Spark casts it); a string against a number is refused, as Arrow does."""
    if left.type == pa.null() and right.type == pa.null():  # NULL and NULL: null, whatever the operator
        return left.cast(pa.int32()), right.cast(pa.int32())
    if left.type == pa.null():
        left = left.cast(right.type)
    elif right.type == pa.null():
        right = right.cast(left.type)
    if _is_number(left.type) and _is_number(right.type) and left.type != right.type \
            and (pa.types.is_floating(left.type) or pa.types.is_floating(right.type)):
        kind = _common([left.type, right.type])  # as Spark: a big integer and a double meet as doubles
        left, right = left.cast(kind, safe=False), right.cast(kind, safe=False)
    for a, b in ((left, right), (right, left)):
        if pa.types.is_string(b.type) and isinstance(b, pa.Scalar) and b.is_valid:
            if pa.types.is_date(a.type):
                cast = b.cast(a.type)
            elif pa.types.is_timestamp(a.type):
                cast = _timestamp(b.as_py(), a.type)
            else:
                continue
            left, right = (a, cast) if a is left else (cast, a)
    return left, right


def _timestamp(text: str, kind: pa.TimestampType) -> pa.Scalar:
    """A timestamp literal, or a string compared with a timestamp, as Spark casts it in lakefeed's session time zone
    (UTC; daemon/ops/spark.py). A zone in the text is kept, except against a timestamp without one."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Unsupported(f"{text!r} is not a timestamp lakefeed reads") from None
    if kind.tz is None:
        if moment.tzinfo is not None:
            raise Unsupported(f"{text!r} has a time zone, and the column's timestamps have none")
        return pa.scalar(moment, kind)
    return pa.scalar(moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC), kind)


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def _common(kinds: list[pa.DataType]) -> pa.DataType:
    """The type values of `kinds` meet in (Spark's wider type: an integer and a double meet as doubles)."""
    return pa.unify_schemas([pa.schema([("v", k)]) for k in kinds], promote_options="permissive").field("v").type


def _compare(name: str, left: Value, right: Value) -> Value:
    left, right = _paired(left, right)
    out = getattr(pc, name)(left, right)
    if not (pa.types.is_floating(left.type) or pa.types.is_floating(right.type)):
        return out
    both, only_left, only_right = _NAN[name]
    left_nan, right_nan = _is_nan(left), _is_nan(right)
    return pc.if_else(pc.and_(left_nan, right_nan), both,
                      pc.if_else(left_nan, only_left, pc.if_else(right_nan, only_right, out)))


def _is_nan(value: Value) -> Value:
    return pc.is_nan(value) if pa.types.is_floating(value.type) else pc.not_equal(pc.is_null(value), pc.is_null(value))


def _arithmetic(name: str, left: Value, right: Value) -> Value:
    left, right = _paired(left, right)
    for side in (left, right):
        if not _is_number(side.type):
            raise Unsupported(f"lakefeed does arithmetic on numbers, not on {side.type}")
    return getattr(pc, name)(left, right)


def _divide(left: Value, right: Value) -> Value:
    """`/` as Spark: in doubles (of integers or doubles); a division by zero fails the row."""
    left, right = _paired(left, right)
    for side in (left, right):
        if not (pa.types.is_integer(side.type) or pa.types.is_floating(side.type)):
            raise Unsupported(f"lakefeed divides integers and doubles, not {side.type}")
    divisor = right.cast(pa.float64(), safe=False)  # as Spark: a big integer loses its last digits
    zero = pc.and_(pc.equal(divisor, 0.0), pc.is_valid(left))  # null / 0 is null
    if (zero.as_py() if isinstance(zero, pa.Scalar) else pc.any(zero).as_py()):
        raise ZeroDivisionError("division by zero")
    return pc.divide(left.cast(pa.float64(), safe=False), divisor)


def _remainder(left: Value, right: Value, rows: int) -> Value:
    """`%` as Spark (Java's remainder: the sign of the dividend), of integers or doubles; by zero fails the row."""
    left, right = _paired(left, right)
    for side in (left, right):
        if not (pa.types.is_integer(side.type) or pa.types.is_floating(side.type)):
            raise Unsupported(f"lakefeed takes remainders of integers and doubles, not of {side.type}")
    kind = _common([left.type, right.type])
    left, right = (pa.repeat(x, rows) if isinstance(x, pa.Scalar) else x for x in (left, right))
    left, right = left.cast(kind, safe=False), right.cast(kind, safe=False)
    valid = pc.and_(pc.is_valid(left), pc.is_valid(right)).to_numpy(zero_copy_only=False)
    dividend = pc.fill_null(left, 0).to_numpy(zero_copy_only=False)
    divisor = pc.fill_null(right, 1).to_numpy(zero_copy_only=False)
    if (valid & (divisor == 0)).any():
        raise ZeroDivisionError("division by zero")
    if pa.types.is_integer(kind):  # x % -1 is 0, as x % 1: never the overflow of the smallest integer by -1
        divisor = np.where(divisor == -1, 1, divisor)
    with np.errstate(all="ignore"):
        return pa.array(np.fmod(dividend, divisor), kind, mask=~valid)


def _numeric(function: Callable[[Any], Value], value: Value) -> Value:
    if value.type == pa.null():
        return value
    if not _is_number(value.type):
        raise Unsupported(f"lakefeed does arithmetic on numbers, not on {value.type}")
    return function(value)


def _text(value: Value) -> Value:
    if value.type == pa.null():
        return value.cast(pa.string())
    if not (pa.types.is_string(value.type) or pa.types.is_large_string(value.type)):
        raise Unsupported(f"lakefeed applies text functions to strings, not to {value.type}")
    return value
