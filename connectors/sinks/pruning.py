"""Which files of a Delta table may hold some of a set of key values, by the files' min/max statistics: a lookup
reads only those (`may_hold`); and a value above all of a column's (`upper_bound`: whether a key may have a newer
stored row). A file left out wrongly loses a present key (a delete comes back, an update is taken for one of
an absent key), so each bound is widened where writers record it inexactly, as the `_delta_log`s of tables that
delta-rs 1.6 and delta-spark 4.4 write here show:

- timestamps, with a time zone or without, are cut to the millisecond: a file holding 12:00:00.000900 records the
  max 12:00:00.000 (data_files.py writes them so too);
- strings are cut to a prefix, by delta-rs at 64 bytes, by delta-spark at 32 characters. Both keep a cut max above
  the values (delta-rs increments its last character, delta-spark appends U+007F or U+10FFFF), but older
  delta-spark releases appended U+FFFD, which sorts below every character past U+FFFF, and a writer may also
  leave the bare prefix;
- decimals go through a JSON float (delta-rs): about 16 significant digits, rounded either way (a file of
  2.999999999999999999 records the min 3.0).
"""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal, localcontext

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

_MILLISECOND = np.timedelta64(1, "ms")
_MILLISECOND_IN = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}  # a millisecond in each unit (seconds: one)
_FLOAT_ERROR = Decimal("1e-15")  # relative; a double's rounding is 2^-53 (1.1e-16)
_TIE_BREAKERS = "\x7f\ufffd\U0010ffff"  # what delta-spark's releases append to a cut max


def may_hold(table: DeltaTable, column: str, values: pa.Array) -> ds.Dataset:
    """The table's files, less those whose statistics of `column` show they hold none of `values`."""
    dataset = table.to_pyarrow_dataset()
    actions = pa.table(table.get_add_actions(flatten=True))
    low, high = f"min.{column}", f"max.{column}"
    if low not in actions.column_names or high not in actions.column_names:
        return dataset
    actions = actions.filter(pc.and_(pc.is_valid(actions.column(low)), pc.is_valid(actions.column(high))))
    ordered = values.take(pc.array_sort_indices(values)).to_numpy(zero_copy_only=False)
    mins, maxs = (actions.column(c).cast(values.type).to_numpy(zero_copy_only=False) for c in (low, high))
    # A file holds a value if one lies between its bounds: the two insertion points then differ.
    first, past = np.searchsorted(ordered, _lower(mins, values.type), "left"), _past(ordered, maxs, values.type)
    outside = set(actions.column("path").filter(pa.array(first == past)).to_pylist())
    kept = [f for f in dataset.get_fragments() if f.path not in outside]  # a path spelt otherwise is read
    return ds.FileSystemDataset(kept, dataset.schema, dataset.format, dataset.filesystem)


def _lower(mins: np.ndarray, kind: pa.DataType) -> np.ndarray:
    """Bounds at or below every value of their files. A cut string is its own prefix: never above."""
    if pa.types.is_timestamp(kind):
        return mins - _MILLISECOND  # a writer that rounds rather than cuts stays inside too
    if pa.types.is_decimal(kind):
        return _decimals(mins, -1, kind.scale)
    return mins


def _past(ordered: np.ndarray, maxs: np.ndarray, kind: pa.DataType) -> np.ndarray:
    """For each file's max, the insertion point in `ordered` past every value it may stand for."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        bounds = [_above_prefix(m) for m in maxs]
        past = np.searchsorted(ordered, np.array([b or "" for b in bounds], dtype=object), "left")
        return np.where([b is None for b in bounds], len(ordered), past)
    if pa.types.is_timestamp(kind):
        maxs = maxs + _MILLISECOND
    elif pa.types.is_decimal(kind):
        maxs = _decimals(maxs, 1, kind.scale)
    return np.searchsorted(ordered, maxs, "right")


def _above_prefix(bound: str) -> str | None:
    """The least string above every string whose prefix of the bound's length is at most the bound (so above
    whatever it was cut from), its tie-breakers taken off first; None when there is none (no upper bound)."""
    stem = bound.rstrip(_TIE_BREAKERS)
    return stem[:-1] + chr(ord(stem[-1]) + 1) if stem else None


def _decimals(bounds: np.ndarray, sign: int, scale: int) -> np.ndarray:
    """Decimal bounds moved outwards (`sign`) past a float's rounding and the scale's last digit."""
    with localcontext() as context:
        context.prec = 80  # exact: the type holds 38 digits at most
        return np.array([b + sign * (abs(b) * _FLOAT_ERROR + Decimal(1).scaleb(-scale)) for b in bounds],
                        dtype=object)


def upper_bound(actions: pa.Table, column: str, kind: pa.DataType) -> pa.Scalar | None:
    """A value of type `kind` at or above every value of `column` in the files of `actions` (add actions with
    statistics), or None: a file records no max (no statistics, or only nulls), or the type is not one widened."""
    stat = f"max.{column}"
    if stat not in actions.column_names or actions.column(stat).null_count:
        return None
    top = pc.max(actions.column(stat))
    try:
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_date(kind):
            return top.cast(kind)
        if pa.types.is_timestamp(kind):  # cut to the millisecond
            return pa.scalar(top.cast(kind).value + _MILLISECOND_IN[kind.unit], kind)
        if pa.types.is_decimal(kind):  # through a JSON float
            wider = _decimals(np.array([top.as_py()], dtype=object), 1, kind.scale)[0]
            return pa.scalar(wider.quantize(Decimal(1).scaleb(-kind.scale), rounding=ROUND_CEILING), kind)
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):  # cut to a prefix
            above = _above_prefix(top.as_py())
            return None if above is None else pa.scalar(above, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ArithmeticError):
        pass  # a value the type cannot hold: no bound
    return None
