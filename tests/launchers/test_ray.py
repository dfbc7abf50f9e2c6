"""Ray Train: one TorchTrainer worker per plan rank on a local 2-CPU Ray, each handed its attestation."""

from __future__ import annotations

from typing import Any

import pytest

from ._checks import check_bound_ranks

pytestmark = pytest.mark.slow


def test_ray_workers_are_bound_to_plan_coordinates(ray_records: list[dict[str, Any]], tiny_ddp: Any) -> None:
    check_bound_ranks(ray_records, tiny_ddp.PLAN, "ray_train")
    assert sorted(r["local_rank"] for r in ray_records) == [0, 1]
    assert [r["launch_admission"] for r in ray_records] == ["unverified", "unverified"]  # the gate's decision


def test_ray_worker_failure_is_raised_on_the_driver(local_ray: Any) -> None:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import RayTrainLauncher
    from tests.launchers._jobs import fail_on_rank1

    with pytest.raises(Exception, match="boom on rank 1"):
        RayTrainLauncher(ParallelPlan(dp_replicate=2), admission="unverified").run(fail_on_rank1)


def test_ray_mixle_launch_form(local_ray: Any, tmp_path: Any) -> None:
    import json

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.training_launchers import RayTrainLauncher
    from tests.launchers._jobs import mixle_config_loop

    plan = ParallelPlan(dp_replicate=2)
    RayTrainLauncher(admission="unverified").launch(mixle_config_loop, plan=plan, use_gpu=False,
                              train_loop_config={"out": str(tmp_path), "mine": 7})
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, record in enumerate(records):
        assert record["plan"] == plan.as_dict() and record["mine"] == 7
        assert record["attestation"]["rank"] == rank and record["attestation"]["world_size"] == 2
        assert record["attestation"]["coordinate"]["dp_replicate"] == rank
        assert record["group"] == [rank, 2]  # Ray Train's live process group matches the attestation
    with pytest.raises(ValueError, match="reserved keys"):
        RayTrainLauncher().launch(mixle_config_loop, plan=plan, train_loop_config={"mixle_parallel_plan": 1})
    with pytest.raises(TypeError, match="without a plan"):
        RayTrainLauncher().launch(mixle_config_loop)
