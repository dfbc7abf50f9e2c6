"""Fabric and Ray Train launches pass their plan through the admission gate before any rank starts (issue 23
item 6). Nothing is launched here: a refused plan must never reach Fabric or Ray."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from mixle_parallel.contracts import CapabilityError, NotAdmittedError, ParallelPlan
from mixle_parallel.executors import LightningFabricLauncher, RayTrainLauncher
from mixle_parallel.verification.keys import TrustStore

PLAN = ParallelPlan(dp_replicate=2)


@pytest.fixture
def policy_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A trust store of its own that forbids automatic certification: no certificate can fit."""
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path))
    TrustStore().set_policy("off")
    return tmp_path


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the launcher reached Fabric/Ray although the plan was not admitted")


def test_fabric_launch_refuses_before_fabric_exists(policy_off: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = LightningFabricLauncher(PLAN, accelerator="cpu")
    monkeypatch.setattr(LightningFabricLauncher, "fabric", _never)
    with pytest.raises(NotAdmittedError, match="torch_native on dp_replicate=2.*lightning_fabric started no worker"):
        launcher.launch(lambda context: None)


def test_fabric_create_refuses_before_lightning_is_imported(policy_off: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightning", None)  # importing lightning now fails
    monkeypatch.setitem(sys.modules, "lightning.fabric", None)
    with pytest.raises(NotAdmittedError, match="mixle-parallel certify --backend torch_native --plan dp_replicate=2"):
        LightningFabricLauncher().create(plan=PLAN, accelerator="cpu")


def test_ray_run_and_launch_refuse_before_ray_is_touched(policy_off: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ray", "ray.train", "ray.train.torch"):
        monkeypatch.setitem(sys.modules, name, None)  # importing ray now fails (MissingExtraError)
    with pytest.raises(NotAdmittedError, match="ray_train started no worker"):
        RayTrainLauncher(PLAN).run(lambda context: None)
    with pytest.raises(NotAdmittedError, match="torch_native on dp_replicate=2"):
        RayTrainLauncher().launch(lambda config: None, plan=PLAN)


def test_a_certificate_that_does_not_fit_is_refused_before_launch(policy_off: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LightningFabricLauncher, "fabric", _never)
    bogus = tmp_path / "cert.json"
    bogus.write_text("{}")
    with pytest.raises(NotAdmittedError, match="started no worker"):
        LightningFabricLauncher(PLAN, accelerator="cpu", certificate=str(bogus)).launch(lambda context: None)
    for name in ("ray", "ray.train", "ray.train.torch"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(NotAdmittedError, match="started no worker"):
        RayTrainLauncher(PLAN, certificate=str(bogus)).run(lambda context: None)


def test_the_launch_gate_checks_the_backend_and_its_capabilities(policy_off: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ray", "ray.train", "ray.train.torch"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(CapabilityError, match="fp8"):
        RayTrainLauncher(PLAN, precision="fp8").run(lambda context: None)
    with pytest.raises(Exception, match="unknown training backend 'nope'"):
        RayTrainLauncher(PLAN, backend="nope").run(lambda context: None)


@pytest.mark.slow  # the harness starts 2 gloo ranks: about 40 s on a loaded 2-core machine
def test_with_no_certificate_the_launch_certifies_on_the_spot_and_stores_it(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path))  # a fresh machine: no key, no certificate
    first = RayTrainLauncher(PLAN).admit(PLAN)  # the harness, on this machine, before any worker
    assert first.mode == "certified" and "certified on the spot" in first.notes[0]
    again = LightningFabricLauncher(PLAN, accelerator="cpu")._admit(PLAN, "cpu", "32-true")
    assert again.mode == "certified" and again.certificate_id == first.certificate_id
    assert "local store" in again.notes[0]


def test_unverified_is_the_recorded_opt_out() -> None:
    decision = RayTrainLauncher(PLAN, admission="unverified").admit(PLAN)
    assert decision.mode == "unverified" and decision.executor == "torch_native"
    assert LightningFabricLauncher(PLAN, admission="unverified")._admit(PLAN, "cpu", "32-true").mode == "unverified"


def test_one_cpu_rank_needs_no_certificate_and_families_are_measured_small(policy_off: Path) -> None:
    from mixle_parallel.executors.launchers.admission import family_plan, launch_device_kind

    assert RayTrainLauncher(ParallelPlan()).admit(ParallelPlan()).mode == "local"
    assert family_plan(ParallelPlan(dp_replicate=8, tp=4, gradient_accumulation_steps=4)) == ParallelPlan(
        dp_replicate=2, tp=2, gradient_accumulation_steps=4)
    assert (launch_device_kind("cpu"), launch_device_kind("gpu"), launch_device_kind("cuda:1")) == ("cpu", "cuda",
                                                                                                     "cuda")
