"""GPU check: megatron's distributed optimizer (dp_shard) and alltoall MoE dispatcher over NCCL.

Skipped on CPU because megatron-core 0.16.1's DistributedOptimizer accepts only parameters whose
``Tensor.type()`` is ``torch.cuda.FloatTensor`` / ``HalfTensor`` / ``BFloat16Tensor``
(``_build_model_and_main_param_groups`` raises TypeError for ``torch.FloatTensor``) — a tensor
method the module-scoped CPU layer does not, and should not, patch. Needs 2 CUDA devices (NCCL
refuses two ranks on one GPU). Run: ``pytest tests/device -m device``.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed"),
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs 2 CUDA devices: megatron's DistributedOptimizer rejects CPU tensors "
                              "(Tensor.type() must be torch.cuda.*Tensor) and NCCL needs one GPU per rank"),
]


def _body(rank: int, world: int) -> dict:
    import torch

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors.megatron.backend import MegatronBackend
    from tests.megatron import _scenarios as S

    torch.cuda.set_device(rank)
    plan = ParallelPlan(dp_shard=2, microbatches=2)
    session = MegatronBackend(sharded_data_parallel=True).prepare(
        S.mlp(), plan=plan, loss_fn=S.mse, activation_shape=(S.HID,), lr=S.LR, admission="unverified",
        device=f"cuda:{rank}")
    expected, ref_losses = S.reference_run(plan, 4)
    xs, ys = S.data(plan, 4)
    for s in range(S.STEPS):
        receipt = session.train_batch(xs[s, 0, rank], ys[s, 0, rank])
    errors = {k: float((v.cpu() - expected[k]).abs().max()) for k, v in session.stage.state_dict().items()}
    session.close()
    return {"errors": errors, "loss": receipt.loss, "ref": ref_losses[-1]}


def test_distributed_optimizer_matches_reference_on_two_gpus():
    from mixle_parallel.verification.harness.mesh import run_world

    ranks = run_world(_body, 2, timeout=600.0, torchrun_env=True, backend="cpu:gloo,cuda:nccl")
    for out in ranks:
        assert max(out["errors"].values()) <= 1e-5, out
        assert abs(out["loss"] - out["ref"]) <= 1e-5, out
