"""Canonical statistic bytes: equal iff bitwise equal, pickle-free, plain data only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mixle_parallel.contracts.estimation import (
    StatisticFormatError,
    canonical_statistic_bytes,
    statistic_digest,
    statistics_equal,
)

leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
                 st.lists(st.floats(allow_nan=False), max_size=4).map(np.array))
tree = st.recursive(leaf, lambda c: st.one_of(st.tuples(c, c), st.dictionaries(st.text(max_size=3), c, max_size=3)),
                    max_leaves=8)


@given(tree)
def test_bytes_are_a_function_of_the_value(value):
    assert canonical_statistic_bytes(value) == canonical_statistic_bytes(value)
    assert statistic_digest(value).startswith("sha256:")


def test_bits_matter_and_layout_does_not():
    assert not statistics_equal(0.0, -0.0)
    assert not statistics_equal(1.0, 1.0 + 2**-52)
    assert not statistics_equal(np.zeros(2), np.zeros(2, dtype=np.float32))
    assert not statistics_equal(np.zeros((2, 1)), np.zeros(2))
    assert not statistics_equal((1.0,), [1.0, 0.0])
    assert not statistics_equal(1, 1.0)
    a = np.arange(6.0).reshape(2, 3)
    assert statistics_equal(a, np.asfortranarray(a))
    assert statistics_equal({"b": 1.0, "a": (2, a)}, {"a": (2, a.copy()), "b": 1.0})
    assert statistics_equal(np.float64(2.5), 2.5)
    assert statistics_equal({1: 2.0, "x": 1.0}, {"x": 1.0, 1: 2.0})


def test_non_plain_data_is_refused_with_the_path():
    with pytest.raises(StatisticFormatError, match=r"\$\[1\]\[0\].*object"):
        canonical_statistic_bytes((1.0, [object()]))
    with pytest.raises(StatisticFormatError, match="dtype object"):
        canonical_statistic_bytes(np.array([1, "a"], dtype=object))
