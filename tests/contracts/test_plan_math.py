"""ParallelPlan rank math: bijection, group partitions, mesh order, and the errors users see."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle_parallel.contracts import (
    ALL_AXES,
    PHYSICAL_AXES,
    MeshCoordinate,
    ParallelAxis,
    ParallelPlan,
    attest_worker_coordinate,
)
from mixle_parallel.verification.strategies import parallel_plans, plans_with_rank


@given(parallel_plans())
def test_rank_coordinate_is_a_bijection(plan: ParallelPlan) -> None:
    coords = [plan.coordinate(r) for r in range(plan.world_size)]
    assert len(set(coords)) == plan.world_size
    assert [plan.rank(cd) for cd in coords] == list(range(plan.world_size))
    assert [plan.rank(cd.as_dict()) for cd in coords] == list(range(plan.world_size))


@given(parallel_plans())
def test_axis_groups_partition_the_world_with_the_right_sizes(plan: ParallelPlan) -> None:
    for axis in ALL_AXES:
        groups = plan.axis_group_ranks(axis)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(plan.world_size)), axis
        assert all(len(g) == plan.size(axis) for g in groups), axis
        assert len(groups) == plan.world_size // plan.size(axis)


@given(parallel_plans())
def test_group_members_differ_only_on_their_axis(plan: ParallelPlan) -> None:
    for axis in PHYSICAL_AXES:
        for group in plan.axis_group_ranks(axis):
            coords = [plan.coordinate(r) for r in group]
            assert [cd[axis] for cd in coords] == list(range(plan.size(axis)))
            for other in PHYSICAL_AXES:
                if other is not axis:
                    assert len({cd[other] for cd in coords}) == 1


@given(parallel_plans())
def test_ep_groups_are_contiguous_blocks_of_data_parallel_groups(plan: ParallelPlan) -> None:
    dp_groups = plan.data_parallel_group_ranks()
    ep_groups = plan.axis_group_ranks("ep")
    expected = [g[i : i + plan.ep] for g in dp_groups for i in range(0, len(g), plan.ep)]
    assert list(ep_groups) == expected
    for group in ep_groups:
        assert [plan.coordinate(r).ep for r in group] == list(range(plan.ep))


@given(parallel_plans())
def test_etp_groups_are_blocks_of_tp_groups(plan: ParallelPlan) -> None:
    tp_groups = plan.axis_group_ranks("tp")
    for group in plan.axis_group_ranks("etp"):
        assert any(set(group) <= set(tp) for tp in tp_groups)
        assert [plan.coordinate(r).etp for r in group] == list(range(plan.etp))


@given(plans_with_rank())
def test_attestation_matches_coordinate(plan_rank: tuple[ParallelPlan, int]) -> None:
    plan, rank = plan_rank
    att = attest_worker_coordinate(plan, actual_world_size=plan.world_size, rank=rank)
    assert att.coordinate == plan.coordinate(rank)
    assert (att.rank, att.world_size) == (rank, plan.world_size)


def test_tp_varies_fastest_and_pp_slowest() -> None:
    plan = ParallelPlan(pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2)
    assert plan.world_size == 32
    assert plan.coordinate(1) == MeshCoordinate(tp=1)
    assert plan.coordinate(2) == MeshCoordinate(cp=1)
    assert plan.coordinate(4) == MeshCoordinate(dp_shard=1, ep=0)
    assert plan.coordinate(8).dp_replicate == 1
    assert plan.coordinate(16).pp == 1
    assert plan.axis_group_ranks("tp")[0] == (0, 1)


def test_mesh_lists_active_physical_axes_in_order() -> None:
    plan = ParallelPlan(tp=2, dp_shard=4, pp=2, ep=2)
    assert plan.mesh.names == ("pp", "dp_shard", "tp")
    assert plan.mesh.shape == (2, 4, 2)
    assert ParallelPlan().mesh.names == ()
    assert plan.active_axes == (ParallelAxis.PP, ParallelAxis.DP_SHARD, ParallelAxis.TP, ParallelAxis.EP)


def test_sizes_and_derived_axes() -> None:
    plan = ParallelPlan(dp_replicate=2, dp_shard=3, tp=4, etp=2, ep=6)
    assert plan.world_size == 24  # ep and etp are not mesh dimensions
    assert plan.data_parallel_size == 6
    assert plan.size("ep") == 6 and plan.size(ParallelAxis.ETP) == 2
    assert plan.axis_family == frozenset({ParallelAxis.DP_REPLICATE, ParallelAxis.DP_SHARD, ParallelAxis.TP,
                                          ParallelAxis.EP, ParallelAxis.ETP})


def test_hsdp_data_parallel_groups_order_replicate_then_shard() -> None:
    plan = ParallelPlan(dp_replicate=2, dp_shard=2, tp=2)
    assert plan.data_parallel_group_ranks() == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert plan.axis_group_ranks("dp_shard") == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert plan.axis_group_ranks("dp_replicate") == ((0, 4), (1, 5), (2, 6), (3, 7))


@pytest.mark.parametrize("field", ["dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "etp", "microbatches",
                                   "gradient_accumulation_steps"])
@pytest.mark.parametrize("value,error", [(0, ValueError), (-1, ValueError), (True, TypeError), (2.0, TypeError),
                                         ("2", TypeError)])
def test_every_size_is_an_exact_positive_int(field: str, value: object, error: type) -> None:
    with pytest.raises(error, match=field):
        ParallelPlan(**{field: value})


def test_ep_must_divide_data_parallel_size() -> None:
    with pytest.raises(ValueError, match=r"ep=3 must divide the data-parallel size .*=4.*\[1, 2, 4\]"):
        ParallelPlan(dp_shard=4, ep=3)
    ParallelPlan(dp_shard=2, dp_replicate=2, ep=4)


def test_etp_must_divide_tp() -> None:
    with pytest.raises(ValueError, match=r"etp=2 must divide tp=3"):
        ParallelPlan(tp=3, etp=2)
    ParallelPlan(tp=4, etp=2)


def test_validate_world_size_names_the_fix() -> None:
    plan = ParallelPlan(dp_shard=2, tp=2)
    plan.validate_world_size(4)
    with pytest.raises(ValueError, match="needs world size 4 .*but 2 processes"):
        plan.validate_world_size(2)
    with pytest.raises(TypeError):
        plan.validate_world_size(4.0)  # type: ignore[arg-type]


def test_rank_and_coordinate_reject_out_of_range() -> None:
    plan = ParallelPlan(tp=2)
    with pytest.raises(ValueError, match="outside the plan's world"):
        plan.coordinate(2)
    with pytest.raises(TypeError):
        plan.coordinate(True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tp=2 is outside"):
        plan.rank(MeshCoordinate(tp=2))
    with pytest.raises(ValueError, match="unknown axes"):
        plan.rank({"zz": 0})
    with pytest.raises(ValueError, match="unknown parallel axis"):
        plan.axis_group_ranks("model")


def test_rank_rejects_inconsistent_ep_index() -> None:
    plan = ParallelPlan(dp_shard=4, ep=2)
    assert plan.coordinate(3).ep == 1
    with pytest.raises(ValueError, match="ep=1 disagrees"):
        plan.rank(MeshCoordinate(dp_shard=2, ep=1))


def test_attestation_rejects_wrong_world_and_rank() -> None:
    plan = ParallelPlan(dp_shard=2)
    with pytest.raises(ValueError, match="needs world size 2"):
        attest_worker_coordinate(plan, actual_world_size=3, rank=0)
    with pytest.raises(ValueError, match="outside"):
        attest_worker_coordinate(plan, actual_world_size=2, rank=2)
    with pytest.raises(TypeError):
        attest_worker_coordinate({"dp_shard": 2}, actual_world_size=2, rank=0)  # type: ignore[arg-type]


def test_from_mapping_rejects_unknown_fields() -> None:
    assert ParallelPlan.from_mapping({"tp": 2}) == ParallelPlan(tp=2)
    with pytest.raises(ValueError, match="unknown ParallelPlan fields"):
        ParallelPlan.from_mapping({"tensor_parallel": 2})


@settings(max_examples=25)
@given(st.integers(1, 4), st.integers(1, 4))
def test_group_of_returns_the_group_containing_the_rank(dp: int, tp: int) -> None:
    plan = ParallelPlan(dp_shard=dp, tp=tp)
    for rank, axis in itertools.product(range(plan.world_size), ("dp_shard", "tp")):
        assert rank in plan.group_of(rank, axis)
