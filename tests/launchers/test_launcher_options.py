"""Every launcher option is honoured or refused by name: Ray's storage_path/name reach a given RunConfig,
Fabric's create(precision=, strategy=) pass the launcher's own checks, torchrun picks its backend per device.
No Ray or Fabric process is started here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mixle_parallel.contracts import CapabilityError, ParallelPlan
from mixle_parallel.executors import LightningFabricLauncher, RayTrainLauncher
from mixle_parallel.executors.launchers.ray import merge_run_config
from mixle_parallel.executors.launchers.torchrun import default_process_group_backend


def _run_config_type() -> Any:
    train = pytest.importorskip("ray.train", reason="Ray Train is the optional [ray] extra")
    return train.RunConfig


class _CapturingTrainer:
    """Stands in for ``ray.train.torch.TorchTrainer``: ``fit()`` returns the RunConfig it was given."""

    def __init__(self, loop: Any, *, run_config: Any, **_: Any) -> None:
        self.run_config = run_config

    def fit(self) -> Any:
        return self.run_config


def test_ray_launch_merges_the_launchers_storage_path_and_name_into_a_given_run_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_config_type = _run_config_type()
    import ray.train.torch

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", _CapturingTrainer)
    given = run_config_type(worker_runtime_env={"env_vars": {"SEEN": "1"}})
    before = (given.storage_path, given.name)
    launcher = RayTrainLauncher(ParallelPlan(), storage_path=str(tmp_path), name="job-1")
    used = launcher.launch(lambda config: None, run_config=given)
    assert (used.storage_path, used.name) == (str(tmp_path), "job-1")
    assert used.worker_runtime_env == {"env_vars": {"SEEN": "1"}}  # the rest of the caller's config is kept
    assert (given.storage_path, given.name) == before  # and the caller's object is left alone
    assert launcher.launch(lambda config: None).name == "job-1"  # no run_config: the launcher's own


def test_ray_storage_path_in_both_places_must_agree(tmp_path: Path) -> None:
    run_config_type = _run_config_type()
    same = run_config_type(storage_path=str(tmp_path))
    assert merge_run_config(same, run_config_type, storage_path=str(tmp_path), name=None) is same
    with pytest.raises(ValueError, match=r"RayTrainLauncher\(storage_path=.*conflicts with .*storage_path="):
        merge_run_config(run_config_type(storage_path=str(tmp_path / "other")), run_config_type,
                         storage_path=str(tmp_path), name=None)


def test_ray_name_in_both_places_must_agree() -> None:
    run_config_type = _run_config_type()
    given = run_config_type(name="theirs")
    assert merge_run_config(given, run_config_type, storage_path=None, name=None) is given
    with pytest.raises(ValueError, match=r"RayTrainLauncher\(name='ours'\) conflicts with .*name='theirs'"):
        merge_run_config(given, run_config_type, storage_path=None, name="ours")


def test_fabric_create_routes_precision_and_strategy_through_the_launchers_checks() -> None:
    """Refused before lightning is imported (a fresh interpreter), each naming its option."""
    code = (
        "import json, sys\n"
        "from mixle_parallel.contracts import ParallelPlan\n"
        "from mixle_parallel.executors import LightningFabricLauncher\n"
        "errors = []\n"
        "for options in (dict(precision='bf16-mixed'), dict(precision='fp32'), dict(strategy='ddp_spawn'),\n"
        "                dict(strategy='fsdp')):\n"
        "    try:\n"
        "        LightningFabricLauncher().create(plan=ParallelPlan(dp_replicate=2), accelerator='cpu', **options)\n"
        "    except ValueError as err:\n"
        "        errors.append(str(err))\n"
        "print(json.dumps([errors, sorted(m for m in sys.modules if m.split('.')[0] == 'lightning')]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    errors, lightning = json.loads(done.stdout.strip().splitlines()[-1])
    assert lightning == []
    assert len(errors) == 4, errors
    assert errors[0].startswith("precision='bf16-mixed' (bf16) is refused by LightningFabricLauncher")
    assert "precision='fp32' is not a Fabric precision name" in errors[1]
    assert errors[2].startswith("strategy='ddp_spawn' is refused") and "'ddp'" in errors[2]
    assert errors[3].startswith("strategy='fsdp' is refused")


def test_fabric_precision_is_checked_in_the_constructor_too() -> None:
    plan = ParallelPlan(dp_replicate=2)
    with pytest.raises(CapabilityError, match="precision='16-mixed' .fp16. is refused"):
        LightningFabricLauncher(plan, precision="16-mixed")
    assert LightningFabricLauncher(plan, precision="32-true").fabric_kwargs == {"precision": "32-true"}
    assert LightningFabricLauncher(plan, strategy="ddp").strategy == "ddp"  # the plan's own is accepted


def test_fabric_create_accepts_the_plans_own_strategy_and_precision() -> None:
    pytest.importorskip("lightning", reason="Lightning Fabric is the optional [lightning] extra")
    bound = LightningFabricLauncher().create(plan=ParallelPlan(dp_replicate=2), accelerator="cpu", strategy="ddp",
                                             precision="32-true", admission="unverified")
    assert type(bound.strategy).__name__ == "DDPStrategy" and bound.world_size == 2
    assert bound.admission.mode == "unverified"


def test_torchrun_backend_follows_the_device() -> None:
    assert default_process_group_backend("cpu") == "gloo"
    assert default_process_group_backend("cuda") == "cpu:gloo,cuda:nccl"
