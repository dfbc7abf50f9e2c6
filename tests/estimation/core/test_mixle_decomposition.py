"""Real mixle 0.8.2 models through our decomposition: mixle's declared Decomposition translated, mixle's plans."""

from __future__ import annotations

import numpy as np
import pytest

mstats = pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")
from mixle.stats.compute import decomposition as mdec  # noqa: E402

from mixle_parallel.balance import balance_plan  # noqa: E402
from mixle_parallel.contracts import DeviceSpec, Resources  # noqa: E402
from mixle_parallel.executors.estimation.planning.model_decomposition import work_partition  # noqa: E402
from mixle_parallel.model_decomposition import (  # noqa: E402
    DecompAxis,
    ReductionOp,
    best_parallel_axis,
    compute_cost,
    cost_children,
    decompose_model,
    decomposition_of,
    shard_children,
    size_model_tree,
)


def _devices(n: int, throughputs: list[float] | None = None) -> Resources:
    t = throughputs or [1.0] * n
    return Resources.from_specs([DeviceSpec(f"d{i}", memory_bytes=8 * 1024**3, throughput=t[i]) for i in range(n)])


def _mix(k: int) -> object:
    return mstats.MixtureDistribution([mstats.GaussianDistribution(float(i), 1.0) for i in range(k)], [1.0 / k] * k)


def _hmm(s: int) -> object:
    return mstats.HiddenMarkovModelDistribution([mstats.GaussianDistribution(float(i), 1.0) for i in range(s)],
                                                [1.0 / s] * s, (np.ones((s, s)) / s).tolist(),
                                                len_dist=mstats.PoissonDistribution(4.0))


def test_our_enums_equal_mixles_members_both_ways():
    assert DecompAxis.STATE == mdec.DecompAxis.STATE and mdec.DecompAxis.STATE == DecompAxis.STATE
    assert DecompAxis.STATE != mdec.DecompAxis.COMPONENT and ReductionOp.SUM != mdec.DecompAxis.NONE
    assert DecompAxis(mdec.DecompAxis.FACTOR) is DecompAxis.FACTOR
    assert DecompAxis.TOPIC in {mdec.DecompAxis.TOPIC}


def test_mixles_declared_decomposition_is_translated_with_its_children():
    mix = _mix(3)
    dc = decomposition_of(mix)
    assert dc.axis is DecompAxis.COMPONENT and dc.reduction is ReductionOp.LOGSUMEXP_RESPONSIBILITY
    assert all(u is c for u, c in zip(dc.units, mix.components)) and dc.roles[0] == "component_0"
    hmm = _hmm(4)
    dh = decomposition_of(hmm)
    assert dh.axis is DecompAxis.STATE and len(dh.units) == 4 and dh.owned == (hmm.len_dist,)
    assert len(cost_children(hmm)) == 5 and shard_children(mstats.GaussianDistribution(0.0, 1.0)) == ()
    wrapped = mstats.OptionalDistribution(_mix(6), p=0.2)  # atomic in mixle, its mixture is owned
    sized = size_model_tree(wrapped)
    assert sized.axis is DecompAxis.NONE and sized.children[0].axis is DecompAxis.COMPONENT


def test_hmm_transition_bytes_and_rich_emissions_drive_the_cost():
    assert size_model_tree(_hmm(8)).own_param_bytes > 8 * size_model_tree(_hmm(2)).own_param_bytes
    assert compute_cost(_hmm(20))[0] > 5 * compute_cost(_hmm(3))[0]
    heavy = mstats.MixtureDistribution(
        [mstats.MultivariateGaussianDistribution([0.0] * 10, np.eye(10).tolist()) for _ in range(4)], [0.25] * 4)
    cheap = mstats.MixtureDistribution([mstats.CategoricalDistribution({"a": 0.5, "b": 0.5}) for _ in range(8)],
                                       [1 / 8] * 8)
    assert best_parallel_axis(mstats.CompositeDistribution((heavy, cheap)), max_workers=4).num_units == 4


def test_mixle_plans_match_mixles_decisions():
    cut = decompose_model(_mix(10), _devices(3), n_data=20)
    assert cut.axis == mdec.DecompAxis.COMPONENT and [c.stop - c.start for c in cut.cuts] == [3, 4, 3]
    fast = decompose_model(_mix(12), _devices(2, [3.0, 1.0]), n_data=20)
    assert [c.stop - c.start for c in fast.cuts] == [9, 3]
    assert "data-parallel" in decompose_model(_mix(5), _devices(4), n_data=100_000).rationale
    # mixle 0.8.2's rule (issue 26): 10 units on 2 devices are cut whatever the rows
    assert decompose_model(_mix(10), _devices(2), n_data=10**6).is_model_parallel
    hmm = mstats.HiddenMarkovModelDistribution(
        [mstats.MultivariateGaussianDistribution([0.0] * 4, np.eye(4).tolist()) for _ in range(16)],
        [1 / 16] * 16, (np.ones((16, 16)) / 16).tolist())
    one = balance_plan(hmm, _devices(8), n_data=1)
    assert (one.data_parallel, one.model_parallel, one.axis) == (1, 8, mdec.DecompAxis.STATE)
    assert "no splittable axis" in balance_plan(mstats.GaussianDistribution(0.0, 1.0), _devices(8), n_data=1).rationale


def test_work_partition_places_a_heavy_unit_by_its_midpoint():
    assert work_partition((931.0, 931.0) + (3.0,) * 10, (1.0, 1.0)) == [1, 11]
    assert work_partition((1.0,) * 12, (3.0, 1.0)) == [9, 3]
    assert work_partition((100.0, 1.0, 1.0), (1.0, 1.0, 1.0)) == [1, 1, 1]  # no shard left empty


def test_a_foreign_axis_is_refused_with_the_axes_we_understand():
    class Weird:
        def decomposition(self) -> object:
            return mdec.Decomposition()

    assert decomposition_of(Weird()).axis is DecompAxis.NONE
    bogus = type("D", (), {"axis": type("A", (), {"value": "diagonal"})(), "reduction": ReductionOp.SUM,
                           "num_units": 1, "child_roles": ()})()
    node = type("N", (), {"decomposition": lambda self: bogus})()
    with pytest.raises(TypeError, match="axes understood"):
        decomposition_of(node)
