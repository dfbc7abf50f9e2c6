"""Ray Train: one TorchTrainer worker per plan rank on a local 2-CPU Ray, each handed its attestation."""

from __future__ import annotations

from typing import Any

import pytest

from ._checks import check_bound_ranks

pytestmark = pytest.mark.slow


def test_ray_workers_are_bound_to_plan_coordinates(ray_records: list[dict[str, Any]], tiny_ddp: Any) -> None:
    check_bound_ranks(ray_records, tiny_ddp.PLAN, "ray_train")
    assert sorted(r["local_rank"] for r in ray_records) == [0, 1]


def test_ray_worker_failure_is_raised_on_the_driver(local_ray: Any) -> None:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import RayTrainLauncher
    from tests.launchers._jobs import fail_on_rank1

    with pytest.raises(Exception, match="boom on rank 1"):
        RayTrainLauncher(ParallelPlan(dp_replicate=2)).run(fail_on_rank1)
