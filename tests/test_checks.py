"""CHECK constraints as lakefeed's tasks evaluate them (daemon/batch/checks.py), against Spark's own evaluation.

The model is Spark SQL itself, in ANSI mode as Spark 4 runs by default: a row passes a CHECK when the expression
is true for it (false, null or an error refuse it, as delta-spark's CheckDeltaInvariant does).
"""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lakefeed.batch import checks
from lakefeed.batch.cdc import KIND
from lakefeed.config.model import CdcConfig

SCHEMA = pa.schema([("a", pa.int64()), ("i", pa.int32()), ("b", pa.float64()), ("s", pa.string()),
                    ("d", pa.date32()), ("f", pa.bool_()), ("t", pa.timestamp("us", "UTC"))])
SPARK_SCHEMA = "a BIGINT, i INT, b DOUBLE, s STRING, d DATE, f BOOLEAN, t TIMESTAMP"  # the session's zone: UTC

_ints = st.integers(-4, 4).map(str)
_decimals = st.sampled_from(["0.5", "1.25", "-0.1", "3.0"])
_numbers = st.recursive(
    st.one_of(st.sampled_from(["a", "i", "b"]), _ints, _decimals, st.just("9223372036854775807")),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda x: f"abs({x})"), inner.map(lambda x: f"(- {x})"),
        st.tuples(inner, inner).map(lambda t: f"coalesce({t[0]}, {t[1]})")),
    max_leaves=4)
_texts = st.one_of(st.just("s"), st.sampled_from(["'a'", "'ab'", "''", "'B'", "'é'"]),
                   st.just("s").map(lambda x: f"lower({x})"), st.just("s").map(lambda x: f"upper({x})"))
_compare = st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "<=>"])
_days = st.dates(dt.date(2019, 12, 30), dt.date(2020, 1, 3)).map(lambda d: d.isoformat())
_moments = st.sampled_from(["2020-01-01", "2020-01-01 00:00:00", "2020-01-01 01:30:00", "2019-12-31T23:00:00",
                            "2020-01-01 00:30:00+01:00", "2020-01-01T00:00:00.000001"])
_atoms = st.one_of(
    st.tuples(_numbers, _compare, _numbers).map(" ".join),
    st.tuples(_texts, _compare, _texts).map(" ".join),
    st.tuples(_texts, st.sampled_from(["LIKE", "NOT LIKE", "ILIKE"]), st.sampled_from(["'a%'", "'_'", "'%b'"]))
    .map(" ".join),
    st.tuples(st.sampled_from(["length(s)", "char_length(s)"]), _compare, _ints).map(" ".join),
    st.tuples(st.sampled_from(["a", "b", "s", "d", "f"]), st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
    st.sampled_from(["f", "NOT f", "f = true", "NULL", "true"]),
    st.tuples(_numbers, st.lists(st.one_of(_ints, st.just("NULL")), min_size=1, max_size=3))
    .map(lambda t: f"{t[0]} IN ({', '.join(t[1])})"),
    st.tuples(_numbers, _ints, _ints).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
    st.tuples(_compare.filter(lambda c: c != "<=>"), _days, st.booleans())
    .map(lambda t: f"d {t[0]} {'DATE ' if t[2] else ''}'{t[1]}'"),
    st.tuples(_compare.filter(lambda c: c != "<=>"), _moments, st.booleans())
    .map(lambda t: f"t {t[0]} {'TIMESTAMP ' if t[2] else ''}'{t[1]}'"),
)
EXPRESSIONS = st.recursive(_atoms, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    inner.map(lambda x: f"NOT ({x})")), max_leaves=3)

ROWS = st.lists(st.fixed_dictionaries({
    "a": st.one_of(st.none(), st.integers(-3, 3), st.just(2 ** 62), st.just(-(2 ** 63))),
    "i": st.one_of(st.none(), st.integers(-3, 3)),
    "b": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 0.5, -2.0, 1.25, math.nan, math.inf])),
    "s": st.one_of(st.none(), st.sampled_from(["", "a", "ab", "B", "b", "Ab", "é", "É"])),
    "d": st.one_of(st.none(), st.dates(dt.date(2019, 12, 31), dt.date(2020, 1, 2))),
    "f": st.one_of(st.none(), st.booleans()),
    "t": st.one_of(st.none(), st.sampled_from([dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(
        2020, 1, 1, 1, 30, tzinfo=dt.UTC), dt.datetime(2019, 12, 31, 23, 30, tzinfo=dt.UTC)])),
}), min_size=1, max_size=6)


ANSI_ERRORS = ("ARITHMETIC_OVERFLOW", "DIVIDE_BY_ZERO", "REMAINDER_BY_ZERO")


def _spark_passes(spark, expression: str, rows: list[dict]) -> list[bool]:
    """Whether Spark finds `expression` true for each row; a row it fails to evaluate does not pass."""
    def run(part: list[dict]) -> list[bool]:
        frame = spark.createDataFrame([(n, *(r[k] for k in SCHEMA.names)) for n, r in enumerate(part)],
                                      f"n INT, {SPARK_SCHEMA}")
        got = frame.selectExpr("n", f"coalesce(({expression}), false) AS ok").collect()
        return [r["ok"] for r in sorted(got, key=lambda r: r["n"])]
    try:
        return run(rows)
    except Exception as e:  # an overflow, a division by zero (ANSI): which rows, one at a time
        if not any(error in str(e) for error in ANSI_ERRORS):
            raise
        out = []
        for row in rows:
            try:
                out.extend(run([row]))
            except Exception as one:  # noqa: BLE001 - the row's evaluation failed: it does not pass
                if not any(error in str(one) for error in ANSI_ERRORS):
                    raise
                out.append(False)
        return out


@pytest.fixture(scope="module")
def ansi(spark):
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "true")
    yield spark
    spark.conf.set("spark.sql.ansi.enabled", before)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(expression=EXPRESSIONS, rows=ROWS)
def test_a_check_passes_the_rows_spark_finds_it_true_for(ansi, expression, rows):
    try:
        check = checks.Check("c", expression, SCHEMA)
    except checks.Unsupported:
        assume(False)
        return
    data = pa.Table.from_pylist(rows, SCHEMA)
    ours, spark = check.passes(data).tolist(), _spark_passes(ansi, expression, rows)
    for n, (mine, theirs) in enumerate(zip(ours, spark, strict=True)):
        # Where Spark skips a part that fails for the row (a short-circuit; `0.5 = -a` folded to false), lakefeed
        # still evaluates it and quarantines the row (daemon/batch/checks.py).
        assert mine == theirs or (theirs and _fails(check, data.slice(n, 1))), (expression, rows[n])


def _fails(check: checks.Check, row: pa.Table) -> bool:
    try:
        check._true(row)  # noqa: SLF001 - what `passes` makes of a row whose evaluation fails
    except (pa.ArrowInvalid, ArithmeticError):
        return True
    return False


def test_most_generated_checks_are_evaluated_not_refused():
    """The model test above would prove little if most expressions it draws were Unsupported."""
    refused = []

    @settings(max_examples=300, database=None)
    @given(expression=EXPRESSIONS)
    def draw(expression):
        try:
            checks.Check("c", expression, SCHEMA)
        except checks.Unsupported:
            refused.append(expression)
    draw()
    assert len(refused) < 60, refused[:10]


@pytest.mark.parametrize(("expression", "why"), [
    ("s > 1", "compares or combines values of types"), ("x > 0", "column 'x' is not one of the table's"),
    ("rand() > 0", r"does not evaluate 'RAND\(\)'"), ("a", "is not a condition"), ("sqrt(a) > 1", "does not evaluate"),
    ("st.x > 1", "top-level columns only"), ("a >", "does not parse"), ("1 / 0 > 0", "fails whatever the row"),
    ("a IN (SELECT 1)", "does not evaluate"), ("(NOT a) = 1", "take conditions, not int64"),
])
def test_a_check_lakefeed_cannot_evaluate_is_refused_with_the_reason(expression, why):
    with pytest.raises(checks.Unsupported, match=why):
        checks.Check("c", expression, SCHEMA)


def test_refused_names_the_first_constraint_each_row_breaks_and_spares_deletes():
    target = pa.schema([pa.field("id", pa.int64(), nullable=False), ("amount", pa.float64())])
    rows = pa.table({"id": [1, None, 3, 4], "amount": [5.0, -2.0, -1.0, None]})
    kept, bad = checks.refused(rows, target, (("positive", "amount > 0"),), CdcConfig())
    assert kept.to_pylist() == [{"id": 1, "amount": 5.0}]
    assert [b.reason for _, b in bad] == [
        "column 'id' is NOT NULL in the table, and the row has no value there",
        "breaks the table's CHECK constraint positive (amount > 0)",
        "breaks the table's CHECK constraint positive (amount > 0)"]  # false, and null
    keyed = rows.append_column(KIND, pa.array(["changelog"] * 4)).append_column("op", pa.array(["u", "u", "d", "x"]))
    cdc = CdcConfig(strategy="changelog", primary_key=("id",))
    kept, bad = checks.refused(keyed, target, (("positive", "amount > 0"),), cdc)
    # NOT NULL is left to the MERGE; the delete writes no row; an unknown op is quarantined as such later
    assert kept.column("id").to_pylist() == [1, 3, 4]
    assert [b.reason for _, b in bad] == ["breaks the table's CHECK constraint positive (amount > 0)"]
