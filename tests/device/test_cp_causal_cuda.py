"""Prepared GPU check: causal context parallelism (cp=2) equals the single-device reference.

Causal ring attention needs the CUDA SDPA kernels (flash / memory-efficient / cuDNN); on CPU only
non-causal attention with the MATH backend runs (tests/torch covers that). Run on a machine with
at least 2 CUDA devices:  python -m pytest tests/device/test_cp_causal_cuda.py -m device
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2,
        reason="causal context parallelism needs the CUDA SDPA ops and 2 CUDA devices (cp=2, one rank per GPU); "
        "on CPU only non-causal MATH attention runs, tested in tests/torch",
    ),
]


def causal_cp_scenario() -> dict:
    """Body run on every rank (spawned by _world.run_world with NCCL for CUDA tensors)."""
    import torch.distributed as dist

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from tests.torch._models import global_batches, make_model

    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    session = get_training_backend("torch_native").prepare(
        make_model("causal_attn"), plan=ParallelPlan(cp=2), device=f"cuda:{rank}",
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        admission="unverified",  # a prepared device check, not a certified run: the opt-out is recorded
    )
    losses = []
    for per_rank in global_batches(3, [4]):
        x, y = per_rank[0]
        losses.append(session.train_batch(x.cuda(), y.cuda()).loss)
    params = {n: p.full_tensor().cpu() for n, p in session.module.named_parameters()}
    session.close()
    return {"losses": losses, "params": params}


def test_causal_context_parallel_matches_reference() -> None:
    from tests.torch._models import global_batches, reference_run
    from tests.torch._world import run_world

    ranks = run_world(2, "tests.device.test_cp_causal_cuda", "causal_cp_scenario", backend="cpu:gloo,cuda:nccl")
    ref = reference_run("causal_attn", global_batches(3, [4]), device="cuda")
    for result in ranks:
        for got, want in zip(result["losses"], ref["losses"]):
            assert math.isclose(got, want, rel_tol=1e-4), (got, want)  # fp32, different kernels/order
        for name, want in ref["params"].items():
            torch.testing.assert_close(result["params"][name], want, rtol=1e-3, atol=1e-5)
