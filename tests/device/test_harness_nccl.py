"""Prepared GPU check: the verification harness on an NCCL mesh (one CUDA device per rank).

On a CUDA machine with >= 2 GPUs the harness spawns its ranks with ``cpu:gloo,cuda:nccl``; the
torch_native executor must verify against the single-process reference there too. Skipped on
CPU-only machines (CI), where the same harness runs on gloo in tests/verification.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs 2 CUDA devices for an NCCL mesh (none on this machine)"),
]


def test_torch_native_verifies_on_an_nccl_mesh() -> None:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.verification import verify
    from mixle_parallel.verification.harness.mesh import process_group_backend

    assert "nccl" in process_group_backend(2)
    report = verify("mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative", ParallelPlan(dp_shard=2),
                    precision="fp32", workload="mlp")
    assert report.passed, report.summary()
