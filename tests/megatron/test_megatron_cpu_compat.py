"""The CPU compatibility layer: scoped to megatron's listed modules, idempotent, reversible."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")


def test_layer_patches_only_listed_modules_and_restores_them():
    import torch

    from mixle_parallel.executors.megatron import cpu_compat as compat

    modules = {name: importlib.import_module(name) for name in compat.PATCHED_MODULES}
    assert all(m.torch is torch for m in modules.values())
    with compat.cpu_compat("cpu") as active:
        assert active and compat.is_installed()
        with compat.cpu_compat("cpu"):  # nested use only counts another user
            pass
        assert compat.is_installed()
        for module in modules.values():
            proxy = module.torch
            assert proxy is not torch
            assert proxy.cuda.current_device() == "cpu"
            assert proxy.cuda.synchronize() is None
            assert proxy.zeros([2], device="cuda").device.type == "cpu"
            assert proxy.tensor([1.0], device="cuda:0").device.type == "cpu"
            assert proxy.nn is torch.nn and proxy.float32 is torch.float32  # everything else forwards
        assert importlib.import_module("megatron.core.transformer.moe.moe_utils").te_general_gemm is None
        assert torch.cuda.current_device is not modules["megatron.core.utils"].torch.cuda.current_device
    assert not compat.is_installed()
    assert all(m.torch is torch for m in modules.values())
    assert not hasattr(importlib.import_module("megatron.core.transformer.moe.moe_utils"), "te_general_gemm")


def test_layer_is_inactive_for_a_cuda_device():
    from mixle_parallel.executors.megatron import cpu_compat as compat

    with compat.cpu_compat("cuda:0") as active:
        assert active is False and not compat.is_installed()


def test_uninstall_without_install_is_an_error():
    from mixle_parallel.executors.megatron import cpu_compat as compat

    with pytest.raises(RuntimeError, match="not installed"):
        compat.uninstall_cpu_compat()


def test_capabilities_and_plan_checks_need_no_process_group():
    from mixle_parallel.contracts import CapabilityError, ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from mixle_parallel.executors.megatron.parallel_state import megatron_rank_generator_coordinate

    backend = get_training_backend("megatron")
    caps = backend.capabilities
    assert caps.name == "megatron" and not caps.distributed_optimizer and caps.precisions == {"fp32"}
    with pytest.raises(CapabilityError, match="dp_shard"):
        backend.validate(ParallelPlan(dp_shard=2))
    with pytest.raises(CapabilityError, match="etp"):
        backend.validate(ParallelPlan(dp_replicate=2, tp=2, ep=2, etp=1))
    with pytest.raises(CapabilityError, match="bf16"):
        backend.validate(ParallelPlan(pp=2), precision="bf16")
    # megatron's own RankGenerator places every rank where the plan does
    for plan in (ParallelPlan(pp=2, dp_replicate=2, tp=2), ParallelPlan(dp_replicate=2, dp_shard=2, cp=2),
                 ParallelPlan(pp=3, dp_replicate=2, ep=2), ParallelPlan(dp_replicate=4, tp=2, ep=2, etp=2)):
        for rank in range(plan.world_size):
            assert megatron_rank_generator_coordinate(plan, rank) == plan.coordinate(rank)
