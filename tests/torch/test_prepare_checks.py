"""Single-process checks: lazy registration, capabilities, validation before any collective, local session."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from mixle_parallel.contracts import CapabilityError, ParallelPlan
from mixle_parallel.executors import get_training_backend
from tests.torch._models import TP_PLAN, global_batches, make_model, reference_run


def test_importing_the_package_does_not_import_torch() -> None:
    code = ("import sys, mixle_parallel, mixle_parallel.executors as e; "
            "assert 'torch_native' in e.available_training_backends(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_capabilities_claim_only_tested_axes_and_precisions() -> None:
    backend = get_training_backend("torch_native")
    caps = backend.capabilities
    assert {a.value for a in caps.axes} == {"dp_replicate", "dp_shard", "tp", "cp"}
    assert caps.precisions == frozenset({"fp32", "bf16", "fp16"})  # fp16 and bf16: fp32 master weights + autocast
    assert caps.requirements == ("torch>=2.6",)
    with pytest.raises(CapabilityError, match="pp"):
        backend.prepare(make_model(), plan=ParallelPlan(pp=2))
    with pytest.raises(CapabilityError, match="fp8"):
        backend.prepare(make_model(), plan=ParallelPlan(), precision="fp8")
    with pytest.raises(CapabilityError, match="cp, tp"):
        backend.prepare(make_model(), plan=ParallelPlan(cp=2, tp=2))
    assert isinstance(backend.version, str) and torch.__version__ in backend.version


def test_tp_plan_is_checked_before_any_process_group() -> None:
    backend = get_training_backend("torch_native")
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="no tp_plan"):
        backend.prepare(make_model(), plan=ParallelPlan(tp=2))
    with pytest.raises(ValueError, match="matches no submodule"):
        backend.prepare(make_model(), plan=ParallelPlan(tp=2), tp_plan={"decoder.*": "colwise"})
    with pytest.raises(ValueError, match=r"blocks.0.down \(Linear\) in_features=64 is not divisible by tp=3"):
        backend.prepare(make_model(), plan=ParallelPlan(tp=3), tp_plan=TP_PLAN)
    with pytest.raises(ValueError, match="supports nn.Linear and nn.Embedding, not Block"):
        backend.prepare(make_model(), plan=ParallelPlan(tp=2), tp_plan={"blocks.0": "colwise"})
    assert not torch.distributed.is_initialized()


def test_multi_rank_plan_without_launcher_names_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node 2"):
        # opt out of admission (checked first, see test_admission_gate.py) to reach the launcher check
        get_training_backend("torch_native").prepare(make_model(), plan=ParallelPlan(dp_shard=2),
                                                     admission="unverified")


def test_torch_version_gate_names_the_installed_version() -> None:
    from mixle_parallel.executors.torch.device_mesh import require_torch

    with pytest.raises(RuntimeError, match=r"torch>=2.6.*torch 2.5.1 is installed"):
        require_torch("2.5.1")
    require_torch("2.13.0+cpu")


def test_single_process_session_matches_reference_and_describes_itself() -> None:
    backend = get_training_backend("torch_native")
    plan = ParallelPlan()
    session = backend.prepare(make_model(), plan=plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    batches = global_batches(3, [5])
    ref = reference_run("mlp", batches)
    for (x, y), want in zip((b[0] for b in batches), ref["losses"]):
        receipt = session.train_batch(x, y)
        assert math.isclose(receipt.loss, want, rel_tol=1e-6)  # same order of sums as the reference: fp32 rounding only
        assert receipt.collective_bytes == 0 and receipt.global_tokens_observed == int((y != -100).sum())
    for name, p in session.module.named_parameters():
        torch.testing.assert_close(p.detach(), ref["params"][name], rtol=1e-5, atol=1e-6)
    assert session.state().step == 3 and session.reduce_sums(2.0, 3.0) == (2.0, 3.0)
    (update,) = backend.describe_updates(plan)
    assert update.node_id == "local" and update.collective.value == "none"
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        session.train_batch(x, y)


def test_describe_updates_per_composition() -> None:
    backend = get_training_backend("torch_native")
    ids = lambda plan: {(u.node_id, u.collective.value) for u in backend.describe_updates(plan)}  # noqa: E731
    assert ids(ParallelPlan(dp_replicate=2)) == {("grad:dp_replicate", "all_reduce"), ("metric:dp", "all_reduce")}
    assert ("grad:dp_shard", "reduce_scatter") in ids(ParallelPlan(dp_replicate=2, dp_shard=2))
    assert ("grad:dp_replicate", "all_reduce") in ids(ParallelPlan(dp_replicate=2, dp_shard=2))
    assert ("act:tp", "all_reduce") in ids(ParallelPlan(dp_shard=2, tp=2))
    assert ("kv:cp", "all_gather") in ids(ParallelPlan(cp=2))
    # the key/value all-gather's backward reduce-scatters their gradients over cp: declared as its own update
    assert ("kv_grad:cp", "reduce_scatter") in ids(ParallelPlan(cp=2))
    # cp composes with dp_shard: FSDP2 shards over both as one flattened dimension
    assert {("param:dp_shard,cp", "all_gather"), ("grad:dp_shard,cp", "reduce_scatter")} <= ids(
        ParallelPlan(dp_shard=2, cp=2))


def test_fsdp_over_dp_shard_and_cp_gets_one_flattened_mesh_dimension() -> None:
    """On a (dp_shard, cp) mesh FSDP2 would replicate over dp_shard (HSDP); the flattened mesh shards over both."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from mixle_parallel.executors.torch.dp_mode import DataParallelMode
    from mixle_parallel.executors.torch.parallelize import fsdp_mesh

    # torch's fake process group (a test utility: a world of 4 in one process, no data moves)
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "cp"))
        flat = fsdp_mesh(DataParallelMode.FSDP, mesh)
        assert flat.ndim == 1 and flat.mesh_dim_names == ("dp_shard_cp",) and flat.size() == 4
        assert fsdp_mesh(DataParallelMode.HSDP, mesh) is mesh  # HSDP keeps (replicate, shard)
    finally:
        dist.destroy_process_group()


def test_optimizer_names_are_case_insensitive_and_unknown_ones_list_the_choices() -> None:
    import torch

    from mixle_parallel.executors.torch.backend import build_optimizer

    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(build_optimizer("adamw", params, 0.1)[0], torch.optim.AdamW)
    assert isinstance(build_optimizer(" SGD ", params, 0.1)[0], torch.optim.SGD)
    with pytest.raises(ValueError, match="unknown optimizer 'adamm'.*AdamW"):
        build_optimizer("adamm", params, 0.1)
