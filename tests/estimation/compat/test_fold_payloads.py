"""checkpointed_fold / finite_guarded_fold on mixle 0.8.2's payloads: pickled (count, value) bytes, in order."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from mixle_parallel.resilient_em import checkpointed_fold
from mixle_parallel.sdc_audit import finite_guarded_fold


class _Acc:
    """A scalar accumulator that logs what the fold does to it."""

    log: list[str] = []

    def __init__(self) -> None:
        self.total = 0.0

    def combine(self, value: float) -> None:
        _Acc.log.append("combine")
        self.total += value

    def value(self) -> float:
        return self.total

    def from_value(self, value: float) -> None:
        _Acc.log.append("from_value")
        self.total = value

    def key_merge(self, stats: dict) -> None:
        _Acc.log.append("key_merge")
        stats["seen"] = True

    def key_replace(self, stats: dict) -> None:
        assert stats.get("seen"), "key_replace must see the dict key_merge filled"
        _Acc.log.append("key_replace")


class _Factory:
    def make(self) -> _Acc:
        _Acc.log.append("make")
        return _Acc()


class _Est:
    def accumulator_factory(self) -> _Factory:
        return _Factory()


def _payloads(values, counts=None):
    counts = counts or [1.0] * len(values)
    return [pickle.dumps((c, v)) for c, v in zip(counts, values)]


class _Lazy:
    """An iterable that records how far it was read."""

    def __init__(self, items):
        self.items, self.read = items, 0

    def __iter__(self):
        for item in self.items:
            self.read += 1
            yield item


def test_checkpointed_fold_folds_pickled_payloads_in_order_then_key_merge_and_key_replace():
    _Acc.log = []
    nobs, value = checkpointed_fold(_Est(), _payloads([0.1, 0.2, 0.3], [2.0, 3.0, 4.0]))
    assert nobs == 9.0 and value == (0.1 + 0.2) + 0.3
    assert _Acc.log == ["make", "combine", "combine", "combine", "key_merge", "key_replace"]
    _Acc.log = []
    cut = checkpointed_fold(_Est(), _payloads([0.1, 0.2, 0.3], [2.0, 3.0, 4.0]), checkpoint_after=1)
    assert cut == (nobs, value)
    assert _Acc.log == ["make", "combine", "combine", "make", "from_value", "combine", "key_merge", "key_replace"]
    assert checkpointed_fold(_Est(), [(2.0, 0.1), (3.0, 0.2), (4.0, 0.3)]) == (nobs, value)  # tuples too


def test_finite_guarded_fold_stops_at_the_first_non_finite_value_after_exactly_i_plus_1_combines():
    _Acc.log = []
    items = _Lazy(_payloads([1.0, 2.0, math.inf, 4.0, 5.0]))
    with pytest.raises(ValueError, match=r"^my fold \(payload index 2, 3 combine\(\) calls so far\)") as err:
        finite_guarded_fold(_Est(), items, "my fold")
    assert _Acc.log.count("combine") == 3 and items.read == 3  # payloads 3 and 4 never read
    assert err.value.chunks == (2, 2)


def test_finite_guarded_fold_names_a_non_finite_count_before_combining_it():
    _Acc.log = []
    with pytest.raises(ValueError, match=r"payload index 1 count"):
        finite_guarded_fold(_Est(), _payloads([1.0, 2.0, 3.0], [1.0, float("nan"), 1.0]))
    assert _Acc.log.count("combine") == 1


def test_finite_guarded_fold_on_finite_payloads_is_checkpointed_fold():
    _Acc.log = []
    payloads = _payloads([0.5, 0.25, 0.125], [1.0, 2.0, 3.0])
    assert finite_guarded_fold(_Est(), payloads) == checkpointed_fold(_Est(), payloads)
    assert _Acc.log.count("key_replace") == 2


def _mixle_payloads(mstats, est, parts):
    out = []
    model = est.estimate(None, _fit_value(mstats, est, np.concatenate(parts)))
    for x in parts:
        acc = est.accumulator_factory().make()
        enc = acc.acc_to_encoder().seq_encode(list(x))
        acc.seq_update(enc, np.ones(len(x)), model)
        out.append(pickle.dumps((float(len(x)), acc.value())))
    return out


def _fit_value(mstats, est, x):
    acc = est.accumulator_factory().make()
    for v in x:
        acc.update(v, 1.0, None)
    return acc.value()


def test_the_folds_match_mixle_0_8_2_bit_for_bit_on_a_mixle_estimator():
    mstats = pytest.importorskip("mixle.stats")
    m_resilient = pytest.importorskip("mixle.utils.parallel.resilient_em")
    m_sdc = pytest.importorskip("mixle.utils.parallel.sdc_audit")
    est = mstats.GaussianEstimator()
    rng = np.random.default_rng(0)
    payloads = _mixle_payloads(mstats, est, [rng.normal(size=n) for n in (7, 11, 5, 9)])
    theirs = m_resilient.checkpointed_fold(est, payloads)
    ours = checkpointed_fold(est, payloads)
    assert pickle.dumps(ours) == pickle.dumps(theirs)
    assert pickle.dumps(checkpointed_fold(est, payloads, checkpoint_after=1)) == pickle.dumps(theirs)
    assert pickle.dumps(finite_guarded_fold(est, payloads)) == pickle.dumps(m_sdc.finite_guarded_fold(est, payloads))
