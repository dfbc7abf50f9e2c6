"""mixle 0.8.2's model-parallel decision: auto_parallel_estimator / decompose_model outcomes and fields, the
.plan of UnrealizedModelPlacementError (the BalancePlan from auto_balanced_estimator)."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel import GaussianEstimator
from mixle_parallel.balance import BalancePlan, auto_balanced_estimator
from mixle_parallel.model_decomposition import DecompAxis, ModelDecomposition, ReductionOp, decompose_model
from mixle_parallel.model_parallel import UnrealizedModelPlacementError, auto_parallel_estimator
from mixle_parallel.planner import DeviceSpec, Resources

OUTCOMES = [  # components, devices, rows -> model parallel? (mixle 0.8.2's own outcomes)
    (5, 4, 100_000, False), (8, 1, 40, False), (12, 4, 40, True), (8, 4, 400, True)]


def _mixture(k: int):
    from mixle_parallel import GaussianDistribution, MixtureDistribution

    return MixtureDistribution([GaussianDistribution(float(i), 1.0) for i in range(k)], np.full(k, 1.0 / k))


def _devices(n: int, throughputs=None) -> Resources:
    return Resources(tuple(DeviceSpec(name=f"cpu:{i}", kind="cpu", index=i,
                                      throughput=1.0 if throughputs is None else throughputs[i]) for i in range(n)))


@pytest.mark.parametrize(("k", "p", "rows", "split"), OUTCOMES)
def test_the_decision_follows_mixles_rule_and_carries_its_fields(k, p, rows, split):
    est = GaussianEstimator()
    if not split:
        same, decision = auto_parallel_estimator(est, _mixture(k), _devices(p), n_data=rows)
        assert same is est  # the caller's estimator, unchanged
    else:
        with pytest.raises(UnrealizedModelPlacementError) as err:
            auto_parallel_estimator(est, _mixture(k), _devices(p), n_data=rows)
        decision = err.value.plan
    assert isinstance(decision, ModelDecomposition) and decision.is_model_parallel is split
    assert decision.num_units == k and isinstance(decision.rationale, str) and decision.rationale
    assert isinstance(decision.extra, dict)
    if split:
        assert (decision.axis, decision.reduction) == (DecompAxis.COMPONENT, ReductionOp.LOGSUMEXP_RESPONSIBILITY)
        assert [c.start for c in decision.cuts] == [0] + [c.stop for c in decision.cuts[:-1]]
        assert decision.cuts[-1].stop == k and len(decision.cuts) == p
        assert all(c.reduction is decision.reduction and c.device.name == f"cpu:{i}"
                   for i, c in enumerate(decision.cuts))
    else:
        assert (decision.axis, decision.cuts) == (DecompAxis.NONE, ())


def test_is_model_parallel_needs_an_axis_and_more_than_one_cut():
    cut = decompose_model(_mixture(12), _devices(4), n_data=40).cuts[0]
    one = ModelDecomposition(DecompAxis.COMPONENT, ReductionOp.LOGSUMEXP_RESPONSIBILITY, 12, (cut,), "one cut")
    assert not one.is_model_parallel
    none = ModelDecomposition(DecompAxis.NONE, ReductionOp.REPLICATE, 12, (cut, cut), "no axis")
    assert not none.is_model_parallel


def test_cuts_are_balanced_by_device_throughput():
    decision = decompose_model(_mixture(9), _devices(3, [1.0, 2.0, 3.0]), n_data=5)
    assert [(c.start, c.stop) for c in decision.cuts] == [(0, 1), (1, 4), (4, 9)]
    decision = decompose_model(_mixture(8), _devices(2, [3.0, 1.0]), n_data=10)
    assert [(c.start, c.stop) for c in decision.cuts] == [(0, 6), (6, 8)]


def test_auto_balanced_estimator_raises_with_its_balance_plan():
    small = Resources(tuple(DeviceSpec(name=f"cpu:{i}", kind="cpu", index=i, memory_bytes=150) for i in range(4)))
    with pytest.raises(UnrealizedModelPlacementError) as err:
        auto_balanced_estimator(GaussianEstimator(), _mixture(6), small, n_data=1000)
    assert isinstance(err.value.plan, BalancePlan) and err.value.plan.is_model_parallel
    assert err.value.plan.model_cuts and "balance plan" in str(err.value)


@pytest.mark.parametrize("case", [*OUTCOMES, (8, 2, 10, True), (9, 3, 5, True)])
def test_the_cuts_are_mixles_on_mixle_models(case):
    """mixle 0.8.2's own decompose_model on the same mixle mixture and devices gives the same cuts."""
    mstats = pytest.importorskip("mixle.stats")
    mdec = pytest.importorskip("mixle.utils.parallel.model_decomposition")
    mplan = pytest.importorskip("mixle.utils.parallel.planner")
    k, p, rows, _ = case
    thr = {(8, 2): [3.0, 1.0], (9, 3): [1.0, 2.0, 3.0]}.get((k, p), [1.0] * p)
    model = mstats.MixtureDistribution([mstats.GaussianDistribution(float(i), 1.0) for i in range(k)],
                                       np.full(k, 1.0 / k))
    theirs = mdec.decompose_model(model, mplan.Resources(tuple(
        mplan.DeviceSpec(name=f"cpu:{i}", kind="cpu", throughput=thr[i]) for i in range(p))), n_data=rows)
    ours = decompose_model(model, _devices(p, thr), n_data=rows)
    assert ours.is_model_parallel == theirs.is_model_parallel and ours.num_units == theirs.num_units
    assert (ours.axis.value, ours.reduction.value) == (theirs.axis.value, theirs.reduction.value)
    assert [(c.device.name, c.start, c.stop, c.reduction.value) for c in ours.cuts] == \
        [(c.device.name, c.start, c.stop, c.reduction.value) for c in theirs.cuts]
