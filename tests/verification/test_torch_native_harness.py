"""torch_native through the harness: its evidence certifies it, and the certificate admits the real backend."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification.attestation import read_unverified
from mixle_parallel.verification.conformance.suite import main_conformance
from mixle_parallel.verification.harness.run import verify
from tests.verification.vhelpers import admits

SPEC = "mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative"


def test_torch_native_fsdp_is_verified_and_certified():
    from mixle_parallel.executors.torch.backend import TorchDistributedBackend

    report = verify(SPEC, ParallelPlan(dp_shard=2), precision="fp32", workload="mlp")
    assert report.passed, report.summary()
    assert {e.node_id for e in report.evidence} == {"param:dp_shard", "grad:dp_shard", "metric:dp"}
    grad = {e.node_id: e for e in report.evidence}["grad:dp_shard"]
    assert any("gloo realizes reduce_scatter as all_reduce" in n for n in grad.notes)
    notes = {e.node_id: " ".join(e.notes) for e in report.evidence}  # each update on the tensor it produces
    assert "compared 3 tensors: output, output/0, output/2" in notes["param:dp_shard"]  # the FSDP2 modules' outputs
    assert "compared 4 tensors: grad/0.bias, grad/0.weight" in notes["grad:dp_shard"]
    assert "compared 2 tensors: count, loss" in notes["metric:dp"]
    cert = report.certify(SPEC)
    assert admits(cert, TorchDistributedBackend(), ParallelPlan(dp_shard=4), "fp32") == \
        read_unverified(cert).certificate_id
    # every dp certification measures an accumulation window, so accumulating plans are admitted too
    window = ParallelPlan(dp_shard=2, gradient_accumulation_steps=2, microbatches=2)
    assert read_unverified(cert).measured_plan == window
    assert admits(cert, TorchDistributedBackend(), ParallelPlan(dp_shard=4, gradient_accumulation_steps=4,
                                                                 microbatches=4), "fp32")


def test_torch_native_passes_the_contract_checks(capsys):
    assert main_conformance(["--backend", SPEC, "--skip-harness"]) == 0
    out = capsys.readouterr().out
    assert "6/6 checks passed" in out  # every check but the harness, which --skip-harness leaves out
    assert "PASS  check_prepare_refuses_unclaimed_axes" in out


@pytest.mark.slow
def test_torch_native_fsdp_tp_tiny_lm_is_verified():
    report = verify(SPEC, ParallelPlan(dp_shard=2, tp=2), precision="fp32", workload="tiny_lm")
    assert report.passed, report.summary()
    assert {e.node_id for e in report.evidence} == {"param:dp_shard", "grad:dp_shard", "act:tp", "metric:dp"}
    act = " ".join({e.node_id: e for e in report.evidence}["act:tp"].notes)
    assert "compared 6 tensors: output/layers.0.attention.wk" in act and "output/layers.0.feed_forward.w2" in act
