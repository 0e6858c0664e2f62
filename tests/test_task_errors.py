"""A task's exception that cannot be pickled reaches the driver as the nearest built-in exception it is, so that the
commit protocol still tells whose fault it is (daemon/ops/spark.py `_travelling`, daemon/pipeline/verdict.py): a
bug is raised, a store fault retried; neither parks the batch as a data fault would."""

from __future__ import annotations

import pickle
import threading

import pytest

from lakefeed.ops.spark import _travelling
from lakefeed.pipeline.verdict import data_fault, store_fault


def _unpicklable(base: type[Exception]) -> Exception:
    class Odd(base):  # a class local to a function: pickle cannot find it by name
        pass

    exc = Odd("went wrong")
    exc.lock = threading.Lock()
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever pickle raises
        pickle.dumps(exc)
    return exc


@pytest.mark.parametrize(("base", "bug", "store"), [(AttributeError, True, False), (TypeError, True, False),
                                                     (OSError, False, True), (ValueError, False, False)])
def test_an_exception_that_cannot_travel_keeps_its_kind_of_fault(base, bug, store):
    sent = _travelling(_unpicklable(base))
    assert type(sent) is base and "Odd: went wrong" in str(sent)
    assert pickle.loads(pickle.dumps(sent)).args == sent.args  # noqa: S301 - our own bytes
    assert (store_fault(sent), data_fault(sent)) == (store, not bug and not store)


def test_an_exception_that_travels_goes_as_it_is():
    exc = KeyError("k")
    assert _travelling(exc) is exc
