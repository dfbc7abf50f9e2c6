"""mixle 0.8.2's shapes of the training contracts: plan.mesh, coordinates, errors, receipt totals."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import (
    BackendCapabilities,
    CapabilityError,
    ContractTypeError,
    MeshShape,
    ParallelPlan,
    StepReceipt,
    UnknownBackendError,
    attest_worker_coordinate,
)
from mixle_parallel.executors.registry import get_encoded_data_backend, get_training_backend


def test_mesh_is_a_names_shape_tuple() -> None:
    names, shape = ParallelPlan(dp_shard=2, tp=2).mesh
    assert (names, shape) == (("dp_shard", "tp"), (2, 2))
    assert ParallelPlan(dp_shard=2, tp=2).mesh == (("dp_shard", "tp"), (2, 2))  # mixle's tuple, same order here
    assert ParallelPlan(dp_replicate=4).mesh == (("dp_replicate",), (4,))
    # ours keeps torchtitan's order where mixle's differs (pp slowest, tp fastest): docs/compat.md
    assert ParallelPlan(tp=2, pp=2).mesh == (("pp", "tp"), (2, 2))
    assert ParallelPlan().mesh == ((), ())


def test_coordinates_iterate_as_axis_index_pairs() -> None:
    plan = ParallelPlan(dp_shard=2, tp=2)
    pairs = list(plan.coordinate(3))
    assert all(isinstance(a, str) and isinstance(i, int) for a, i in pairs)
    assert dict(pairs)["dp_shard"] == 1 and dict(pairs)["tp"] == 1 and dict(pairs)["pp"] == 0
    att = attest_worker_coordinate(plan, actual_world_size=4, rank=2)
    assert dict(att.coordinate) == {**dict(plan.coordinate(2)), "dp_shard": 1, "tp": 0}
    assert att.coordinate["dp_shard"] == 1  # and it still indexes by axis


def test_capability_error_is_value_and_not_implemented() -> None:
    caps = BackendCapabilities("b", {"dp_replicate"})
    for kind in (CapabilityError, ValueError, NotImplementedError):
        with pytest.raises(kind, match="tp"):
            caps.validate(ParallelPlan(tp=2))


def test_unknown_backend_is_key_and_value_error() -> None:
    for kind in (UnknownBackendError, KeyError, ValueError):
        with pytest.raises(kind, match="unknown training backend 'nope'; available: .*torch_native"):
            get_training_backend("nope")
        with pytest.raises(kind, match="unknown encoded-data backend 'nope'"):
            get_encoded_data_backend("nope")
    with pytest.raises(KeyError) as info:
        get_training_backend("nope")
    assert str(info.value).startswith("unknown training backend")  # no KeyError quoting of the message


def test_receipt_global_totals() -> None:
    local = StepReceipt(1, 2.0, 4, 32, 1, 1, 2, "SGD", "fp32")
    assert (local.global_examples, local.global_tokens) == (8, 64)  # estimated: local x data-parallel size
    observed = StepReceipt(1, 2.0, 4, 32, 1, 1, 2, "SGD", "fp32", global_examples_observed=7,
                           global_tokens_observed=50)
    assert (observed.global_examples, observed.global_tokens) == (7, 50)  # the all-reduced counts win


def test_plan_as_dict_and_axis_sizes() -> None:
    plan = ParallelPlan(dp_shard=2, tp=2, microbatches=2)
    d = plan.as_dict()
    assert d["dp_shard"] == 2 and d["tp"] == 2 and d["microbatches"] == 2
    assert d["world_size"] == 4 and d["data_parallel_size"] == 2
    assert {a.value: n for a, n in plan.axis_sizes.items()} == {k: d[k] for k in
                                                                 ("dp_replicate", "dp_shard", "tp", "pp", "cp",
                                                                  "ep", "etp")}


def test_mesh_equals_mixles_tuple_in_mixles_axis_order() -> None:
    # mixle 0.8.2 lists (dp_replicate, dp_shard, tp, pp, cp); ours keeps torchtitan's rank order
    plan = ParallelPlan(dp_replicate=8, tp=2, pp=2, cp=2, ep=4, etp=2)
    assert plan.mesh.names == ("pp", "dp_replicate", "cp", "tp")
    assert plan.mesh == (("dp_replicate", "tp", "pp", "cp"), (8, 2, 2, 2))
    assert not plan.mesh != (("dp_replicate", "tp", "pp", "cp"), (8, 2, 2, 2))
    assert plan.mesh != (("dp_replicate", "tp", "pp", "cp"), (8, 2, 2, 4))  # a size differs
    assert plan.mesh != (("dp_replicate", "tp", "pp"), (8, 2, 2))  # an axis is missing
    assert plan.mesh != (("tp", "tp"), (2, 2)) and plan.mesh != "pp"
    # one rank: mixle names a size-1 dp_replicate, ours nothing; both are the same one-rank mesh
    assert ParallelPlan().mesh == (("dp_replicate",), (1,))
    assert ParallelPlan(tp=2).mesh == (("dp_replicate", "tp"), (1, 2))
    assert len({ParallelPlan(tp=2, pp=2).mesh, MeshShape(("tp", "pp"), (2, 2))}) == 1  # hash follows equality


def test_plan_sizes_accept_integral_numbers_and_refuse_others_as_mixle_does() -> None:
    import numpy as np
    plan = ParallelPlan(tp=np.int64(2), dp_shard=np.int32(2))
    assert type(plan.tp) is int and type(plan.dp_shard) is int and plan.world_size == 4
    for value in (1.9, 2.0, True, "2"):
        with pytest.raises(ValueError, match="must be an int") as caught:
            ParallelPlan(tp=value)
        assert isinstance(caught.value, TypeError)  # both kinds: ContractTypeError
    with pytest.raises(ValueError, match="must be >= 1"):
        ParallelPlan(tp=0)
    with pytest.raises(ContractTypeError, match="number of launched processes"):
        ParallelPlan().validate_world_size(1.9)  # type: ignore[arg-type]
