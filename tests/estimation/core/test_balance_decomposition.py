"""balance and model_decomposition through the declared contract; the planner's Placement run by mp/local."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel import (
    CompositeDistribution,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    UnrealizedModelPlacementError,
    encoded_data,
    plan,
)
from mixle_parallel.balance import auto_balanced_estimator, balance_plan
from mixle_parallel.contracts import DeviceSpec, Resources
from mixle_parallel.model_decomposition import (
    DecompAxis,
    Decomposition,
    ReductionOp,
    best_parallel_axis,
    compute_cost,
    cost_children,
    decompose_model,
    size_model_tree,
    subtree_work,
    tree_axes,
)


def _mix(k: int) -> MixtureDistribution:
    return MixtureDistribution([GaussianDistribution(float(i), 1.0) for i in range(k)], [1.0 / k] * k)


def _devices(n: int, memory: int | None = None, throughputs=None) -> Resources:
    t = throughputs or [1.0] * n
    return Resources.from_specs([DeviceSpec(f"cpu{i}", memory_bytes=memory, throughput=t[i]) for i in range(n)])


class Block:
    """A third-party node declaring its own decomposition: two factors and a shared table."""

    def __init__(self, a, b) -> None:
        self.a, self.b, self.table = a, b, np.zeros((4, 4))

    def decomposition(self) -> Decomposition:
        return Decomposition(axis=DecompAxis.FACTOR, reduction=ReductionOp.SUM, units=(self.a, self.b),
                             roles=("left", "right"), params=(self.table,))


class Opaque:
    """Declares nothing and has no params(): its arrays are not walked (no reflection)."""

    def __init__(self) -> None:
        self.big = np.zeros(1000)


def test_costs_follow_the_declared_parameters():
    assert compute_cost(GaussianDistribution(0.0, 1.0)) == (3.0, 16)  # 1 + two scalars; two float64
    mix = _mix(4)
    assert compute_cost(mix) == (1.0 + 8 + 4 * 3.0, 64 + 4 * 16)  # weights and log-weights are its own
    assert cost_children(mix) == mix.components and subtree_work(mix) == compute_cost(mix)[0]
    assert compute_cost(Opaque()) == (1.0, 0)
    block = Block(GaussianDistribution(0.0, 1.0), _mix(2))
    assert compute_cost(block)[1] == 128 + 16 + compute_cost(block.b)[1]


def test_shared_subtrees_count_once_and_paths_use_roles():
    g = GaussianDistribution(0.0, 1.0)
    mix = MixtureDistribution([g, g, GaussianDistribution(1.0, 1.0)], [1 / 3] * 3)
    sized = size_model_tree(mix)
    assert sized.subtree_param_bytes == 48 + 16 + 16  # g once
    assert [c.path for c in sized.children] == ["component_0", "component_2"]
    nested = size_model_tree(Block(g, mix))
    assert [c.path for c in nested.children] == ["left", "right"]


def test_the_heavy_nested_axis_wins_over_a_thin_parent():
    model = CompositeDistribution([_mix(8), GaussianDistribution(0.0, 1.0)])
    axes = tree_axes(model)
    assert [(a.path, a.axis) for a in axes] == [("/", DecompAxis.FACTOR), ("factor_0", DecompAxis.COMPONENT)]
    best = best_parallel_axis(model, 4)
    assert best.path == "factor_0" and best.num_units == 8 and best.unit_works == (3.0,) * 8


def test_decompose_replicates_when_rows_dominate_and_cuts_by_throughput_otherwise():
    mix = _mix(8)
    # mixle 0.8.2's rule (issue 26): replicate only when the axis has fewer than 2 x devices units
    assert not decompose_model(_mix(3), _devices(2), n_data=10_000).is_model_parallel
    assert decompose_model(mix, _devices(2), n_data=10_000).is_model_parallel
    cut = decompose_model(mix, _devices(2, throughputs=[3.0, 1.0]), n_data=1)
    assert cut.is_model_parallel and cut.axis is DecompAxis.COMPONENT
    assert [(c.start, c.stop) for c in cut.cuts] == [(0, 6), (6, 8)]
    assert not decompose_model(GaussianDistribution(0.0, 1.0), _devices(4), n_data=1).is_model_parallel
    with pytest.raises(TypeError, match="not a Decomposition"):
        compute_cost(type("Bad", (), {"decomposition": lambda self: {}})())


def test_balance_plan_prefers_data_then_memory_then_concurrency():
    mix = _mix(6)
    data = balance_plan(mix, _devices(4, memory=10**9), n_data=10_000)
    assert (data.data_parallel, data.model_parallel, data.fits) == (4, 1, True)
    assert data.per_worker_flops == 2500 * compute_cost(mix)[0]
    one_row = balance_plan(mix, _devices(4), n_data=1)
    assert one_row.model_parallel == 4 and one_row.data_parallel == 1 and one_row.fits is None
    assert sum(c.stop - c.start for c in one_row.model_cuts) == 6
    tight = balance_plan(mix, _devices(4, memory=150), n_data=1000)  # 192 bytes: at least 2 shards
    assert tight.model_parallel >= 2 and tight.extra["m_mem"] == 2
    atomic = balance_plan(GaussianDistribution(0.0, 1.0), _devices(4), n_data=2)
    assert atomic.workers_used == 2 and atomic.rationale.startswith("2 of 4 workers")
    assert "no splittable axis" in atomic.rationale  # the words mixle's tests match
    with pytest.raises(ValueError, match="n_data must be an int >= 1"):
        balance_plan(mix, _devices(2), n_data=0)


def test_auto_balanced_estimator_returns_or_refuses():
    mix, est = _mix(6), GaussianEstimator()
    same, p = auto_balanced_estimator(est, mix, _devices(2, memory=10**9), n_data=1000)
    assert same is est and not p.is_model_parallel
    with pytest.raises(UnrealizedModelPlacementError, match="splits its components"):
        auto_balanced_estimator(est, mix, _devices(4, memory=150), n_data=1000)


@pytest.mark.parametrize("backend", ["local", "mp"])
def test_rows_go_to_workers_by_the_plans_weights(backend):
    x = np.random.default_rng(0).normal(size=8000)
    est = GaussianEstimator()
    placement = plan(x, estimator=est, resources=_devices(2, throughputs=[3.0, 1.0]), num_chunks=8)
    assert [(s.first_chunk, s.last_chunk) for s in placement.shards] == [(0, 6), (6, 8)]
    start = GaussianDistribution(0.1, 2.0)
    with encoded_data(x, estimator=est, backend=backend, num_workers=2, placement=placement,
                      admission="unverified", audit=False) as h:
        placed = h.estep(est, start).stats
        assert h.runner.chunk_owners() == [0] * 6 + [1] * 2
        assert [(r.rank, r.chunks, r.n_obs) for r in h.rank_records] == [(0, 6, 6000), (1, 2, 2000)]
    with encoded_data(x, estimator=est, backend=backend, num_workers=2, num_chunks=8,
                      admission="unverified", audit=False) as h:
        assert h.estep(est, start).stats == placed  # placement never changes the bits


def test_a_placement_that_does_not_match_is_refused_before_workers_start():
    x = np.zeros(1000)
    est = GaussianEstimator()
    p = plan(x, estimator=est, resources=_devices(2), num_chunks=4)
    with pytest.raises(ValueError, match="pass num_workers=2"):
        encoded_data(x, estimator=est, backend="local", num_workers=3, placement=p)
    with pytest.raises(ValueError, match="planned for 1000 rows but the data has 999"):
        encoded_data(x[:999], estimator=est, placement=p)
    with pytest.raises(ValueError, match="4 chunks but this handle has 5"):
        encoded_data(x, estimator=est, backend="local", num_workers=2, num_chunks=5, placement=p)
    with pytest.raises(TypeError, match="takes the Placement"):
        encoded_data(x, estimator=est, placement={"shards": []})
    # placement is an option only mp and local honour (they run chunks where the plan says)
    with pytest.raises(ValueError, match="option placement= is not honoured by backend 'model_parallel'"):
        encoded_data(x, estimator=est, backend="model_parallel", placement=p)
