"""Rows cut into buckets by their key, the same way in every process: a keyed batch's tasks stage each key's rows in
one bucket, so one reduction task sees every change of a key (daemon/pipeline/keyed.py).

Python's own `hash` of text differs from one process to the next; pandas' `hash_array` (SipHash with a fixed key
for text, a fixed mix for numbers) does not, and hashes a column at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pandas.util import hash_array

_NUMBERS = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: a key of several columns mixes its parts in order


def bucket_of(rows: pa.Table, keys: Sequence[str], buckets: int) -> np.ndarray:
    """Each row's bucket, in [0, buckets), from its key's values alone. A key's parts may come in different types
    from one part of a batch to the next (files read before the table fixes them), which the batch's concatenation
    unifies (int64 and double to double, decimals to one scale, timestamps to one unit) before the reduction compares
    them: so values equal once unified hash alike. A number hashes by its value as a double (1, 1.0 and 1.00 alike;
    numbers a double cannot tell apart share a bucket, which is harmless), a timestamp or duration by its
    microseconds, anything else by its text; a null as a value of its own."""
    mixed = np.zeros(rows.num_rows, dtype=np.uint64)
    for key in keys:
        with np.errstate(over="ignore"):
            mixed = mixed * _MULTIPLIER + _hashes(rows.column(key))
    return (mixed % np.uint64(buckets)).astype(np.int64)


def _hashes(column: pa.ChunkedArray) -> np.ndarray:
    kind = column.type
    if any(test(kind) for test in _NUMBERS):
        values = pc.fill_null(pc.cast(column, pa.float64(), safe=False), 0.0).to_numpy() + 0.0  # -0.0 as 0.0
    elif pa.types.is_timestamp(kind) or pa.types.is_duration(kind):
        unit = pa.timestamp("us", kind.tz) if pa.types.is_timestamp(kind) else pa.duration("us")
        values = pc.fill_null(pc.cast(column, unit, safe=False).cast(pa.int64()), 0).to_numpy()
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        values = pc.fill_null(column.cast(pa.large_binary()), b"").to_numpy(zero_copy_only=False)
    else:  # text as it is; any other type by its text (the same text for the same value of one type)
        try:
            values = pc.fill_null(column.cast(pa.string()), "").to_numpy(zero_copy_only=False)
        except pa.ArrowNotImplementedError:  # no text (a list, a struct): one bucket holds every such key
            return np.zeros(len(column), dtype=np.uint64)
    hashed = hash_array(values, categorize=False)
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    return np.where(nulls, np.uint64(1), hashed) if nulls.any() else hashed
