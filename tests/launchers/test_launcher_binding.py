"""Fast checks, no launched job: the attestation rules, the Fabric gate, commands, light imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from mixle_parallel.contracts import CapabilityError, ParallelPlan
from mixle_parallel.executors.launchers.base import bind_launched_rank, describe_attestations, release_process_group

HEAVY = ["torch", "lightning", "lightning_fabric", "ray"]


def _loaded_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the heavy engines it left in sys.modules."""
    loaded = f"sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))"
    probe = f"{code}\nimport sys, json\nprint(json.dumps({loaded}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_launcher_names_are_lazy_and_light() -> None:
    code = (
        "import mixle_parallel, mixle_parallel.executors as e\n"
        "assert 'RayTrainLauncher' not in e.__all__ and 'LightningFabricLauncher' not in e.__all__\n"
        "from mixle_parallel.contracts import ParallelPlan\n"
        "p = ParallelPlan(dp_replicate=2)\n"
        "e.TorchrunLauncher(p).command('x.py'); e.LightningFabricLauncher(p); e.RayTrainLauncher(p).attestations\n"
        "e.LaunchContext, e.bind_launched_rank"
    )
    assert _loaded_after(code) == []


def test_fabric_rejects_every_model_axis_before_importing_lightning() -> None:
    code = (
        "from mixle_parallel.contracts import CapabilityError, ParallelPlan\n"
        "from mixle_parallel.executors import LightningFabricLauncher\n"
        "plans = [dict(tp=2), dict(pp=2), dict(cp=2), dict(dp_replicate=2, ep=2), dict(tp=2, etp=2),\n"
        "         dict(dp_replicate=2, tp=2), dict(dp_replicate=2, dp_shard=2)]\n"
        "for sizes in plans:\n"
        "    try:\n"
        "        LightningFabricLauncher(ParallelPlan(**sizes))\n"
        "    except CapabilityError as err:\n"
        "        assert 'data parallelism' in str(err) and 'TorchrunLauncher' in str(err), err\n"
        "    else:\n"
        "        raise AssertionError(f'{sizes} was accepted')\n"
    )
    assert _loaded_after(code) == []


@pytest.mark.parametrize(
    "sizes, axis",
    [
        ({"tp": 2}, "tp"),
        ({"pp": 2}, "pp"),
        ({"cp": 2}, "cp"),
        ({"dp_replicate": 2, "ep": 2}, "ep"),
        ({"tp": 2, "etp": 2}, "etp"),
    ],
)
def test_fabric_error_names_the_axis(sizes: dict, axis: str) -> None:
    from mixle_parallel.executors import LightningFabricLauncher

    with pytest.raises(CapabilityError, match=f"does not execute axis {axis} "):
        LightningFabricLauncher(ParallelPlan(**sizes))


def test_fabric_strategy_follows_the_plan() -> None:
    from mixle_parallel.executors import LightningFabricLauncher

    assert LightningFabricLauncher(ParallelPlan(dp_replicate=2)).strategy == "ddp"
    assert LightningFabricLauncher(ParallelPlan(dp_shard=2), accelerator="gpu").strategy == "fsdp"
    with pytest.raises(ValueError, match="FSDP only on GPUs"):
        LightningFabricLauncher(ParallelPlan(dp_shard=2), accelerator="cpu")
    with pytest.raises(ValueError, match="derived from the plan"):
        LightningFabricLauncher(ParallelPlan(dp_replicate=2), strategy="ddp_spawn")
    with pytest.raises(ValueError, match="num_nodes"):
        LightningFabricLauncher(ParallelPlan(dp_replicate=2), num_nodes=3)


def test_attestation_binds_each_rank_to_its_plan_coordinate() -> None:
    plan = ParallelPlan(dp_replicate=2, tp=2)
    contexts = [bind_launched_rank(plan, launcher="test", rank=r, world_size=4) for r in range(4)]
    assert [c.coordinate for c in contexts] == [plan.coordinate(r) for r in range(4)]
    assert [c.attestation for c in contexts] == list(describe_attestations(plan))
    # tp varies fastest: ranks 0,1 share the first data-parallel share
    assert [c.data_parallel_index for c in contexts] == [0, 0, 1, 1]
    assert [c.is_logging_rank for c in contexts] == [True, False, False, False]


def test_attestation_rejects_a_launch_that_does_not_fit_the_plan() -> None:
    plan = ParallelPlan(dp_replicate=2)
    with pytest.raises(RuntimeError, match="Launch exactly plan.world_size=2"):
        bind_launched_rank(plan, launcher="test", rank=0, world_size=3)
    with pytest.raises(RuntimeError, match="does not fit plan"):
        bind_launched_rank(plan, launcher="test", rank=2, world_size=2)
    handed = describe_attestations(plan)[0]
    with pytest.raises(RuntimeError, match="disagree on the rank order"):
        bind_launched_rank(plan, launcher="test", rank=1, world_size=2, expected=handed)


def test_attestation_is_checked_against_the_live_process_group(tmp_path: os.PathLike[str]) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1, timeout=timedelta(minutes=5)
    )
    try:
        bind_launched_rank(ParallelPlan(), launcher="test", rank=0, world_size=1)
        with pytest.raises(RuntimeError, match="default group has rank 0 of 1"):
            bind_launched_rank(ParallelPlan(dp_replicate=2), launcher="test", rank=1, world_size=2)
    finally:
        assert release_process_group() is True
    assert release_process_group() is False


def test_releasing_the_group_frees_what_the_rank_left_in_cycles(tmp_path: os.PathLike[str]) -> None:
    """A rank's torch objects left in reference cycles (a DDP module's hooks) are freed when the launcher releases
    the group, not in the interpreter's exit, where their C++ teardown aborted 2 of 7 Fabric ddp ranks."""
    import gc
    import weakref

    import torch.distributed as dist

    class Held:
        pass

    gc.disable()  # only the release may collect the cycle
    try:
        cycle = Held()
        cycle.me = cycle  # type: ignore[attr-defined]
        freed = weakref.ref(cycle)
        del cycle
        dist.init_process_group(
            "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1, timeout=timedelta(minutes=5)
        )
        assert freed() is not None
        assert release_process_group() is True
        assert freed() is None
    finally:
        gc.enable()


def test_ray_launcher_hands_out_one_attestation_per_plan_rank() -> None:
    from mixle_parallel.executors import RayTrainLauncher

    plan = ParallelPlan(dp_shard=2, tp=2)
    attestations = RayTrainLauncher(plan).attestations
    assert [a.rank for a in attestations] == [0, 1, 2, 3]
    assert [a.coordinate for a in attestations] == [plan.coordinate(r) for r in range(4)]
    assert all(a.world_size == 4 for a in attestations)


def test_torchrun_command() -> None:
    from mixle_parallel.executors import TorchrunLauncher

    plan = ParallelPlan(dp_replicate=2, tp=2)
    assert TorchrunLauncher(plan, python="py").command("train.py", "--steps", 3) == [
        "py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "train.py",
        "--steps",
        "3",
    ]
    two_nodes = TorchrunLauncher(plan, nnodes=2, rdzv_endpoint="head:29400", python="py").command("train.py")
    assert two_nodes == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "head:29400",
        "--nproc-per-node",
        "2",
        "train.py",
    ]
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        TorchrunLauncher(plan, nnodes=2)
    with pytest.raises(ValueError, match="dividing"):
        TorchrunLauncher(plan, nnodes=3)


def test_torchrun_worker_needs_the_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from mixle_parallel.executors import TorchrunLauncher

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="not started by torchrun"):
        with TorchrunLauncher.worker(ParallelPlan(dp_replicate=2)):
            pass


def test_torchrun_worker_rejects_a_world_that_does_not_fit_before_any_process_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    from mixle_parallel.executors import TorchrunLauncher

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(RuntimeError, match="torchrun started rank 1 of 3"):
        with TorchrunLauncher.worker(ParallelPlan(dp_replicate=2)):
            pass
    assert not dist.is_initialized()


def test_torchrun_worker_single_rank_binds_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    from mixle_parallel.executors import TorchrunLauncher

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    with TorchrunLauncher.worker(ParallelPlan()) as context:
        assert context.launcher == "torchrun" and context.rank == 0 and context.world_size == 1
        assert [d.name for d in context.handle.devices] == ["rank:0"]
