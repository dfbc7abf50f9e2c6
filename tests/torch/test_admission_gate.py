"""The admission gate in torch_native's prepare(): refused, admitted, mismatched, opted out, verifying.

The gate runs before any process group, mesh or transform exists, so these checks run in one
process: an admitted multi-rank plan gets past the gate and then stops at the missing launcher.
The certificate is a real one: the harness verifies torch_native for the dp_shard family first.
"""

from __future__ import annotations

import pytest
import torch

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan
from mixle_parallel.executors import get_training_backend
from mixle_parallel.verification import verify
from mixle_parallel.verification.admission import save_certificate
from tests.torch._models import make_model

SPEC = "mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative"
NO_LAUNCHER = "torchrun --nproc-per-node"


@pytest.fixture(scope="module", autouse=True)
def module_home(tmp_path_factory: pytest.TempPathFactory):
    """A trust store of this module's own (its certificate is not left in the local store)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path_factory.mktemp("torch-gate-home")))
        yield


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MIXLE_PARALLEL_CERTIFICATE", "MIXLE_PARALLEL_VERIFYING", "RANK", "WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def fsdp_certificate():
    report = verify(SPEC, ParallelPlan(dp_shard=2), precision="fp32", workload="mlp")
    assert report.passed, report.summary()
    return report.certify(SPEC, store=False)


def prepare(plan: ParallelPlan, **kwargs):
    return get_training_backend("torch_native").prepare(make_model(), plan=plan, optimizer="SGD", lr=0.1, **kwargs)


def test_real_mesh_without_certificate_is_refused_before_anything_starts() -> None:
    with pytest.raises(NotAdmittedError) as info:
        prepare(ParallelPlan(dp_shard=2))
    text = str(info.value)
    assert "check 'certificate' failed: no trusted certificate in" in text
    assert "fits torch_native on dp_shard=2 (world 2) at fp32 (cpu/gloo)" in text
    assert "real device mesh (world size 2, cpu/gloo)" in text
    assert ("`mixle-parallel certify --backend torch_native --plan dp_shard=2 --precision fp32 --out cert.json`"
            in text)
    assert not torch.distributed.is_initialized()


def test_certificate_of_the_family_admits_any_size(fsdp_certificate, tmp_path) -> None:
    # admitted: the gate passes and prepare() stops only at the missing launcher
    for kwargs in ({"certificate": fsdp_certificate}, {"admission": fsdp_certificate},
                   {"admission": str(save_certificate(fsdp_certificate, tmp_path / "cert.json"))}):
        with pytest.raises(RuntimeError, match=NO_LAUNCHER):
            prepare(ParallelPlan(dp_shard=4), **kwargs)


def test_certificate_from_the_environment(fsdp_certificate, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MIXLE_PARALLEL_CERTIFICATE", str(save_certificate(fsdp_certificate, tmp_path / "c.json")))
    with pytest.raises(RuntimeError, match=NO_LAUNCHER):
        prepare(ParallelPlan(dp_shard=2))


@pytest.mark.parametrize("plan, precision, reason", [
    (ParallelPlan(dp_replicate=2), "fp32", r"certificate covers axes \['dp_shard'\], the plan uses \['dp_replicate'\]"),
    (ParallelPlan(dp_shard=2, tp=2), "fp32", r"the plan uses \['dp_shard', 'tp'\]"),
    (ParallelPlan(dp_shard=2), "bf16", "check 'precision' failed: certificate is for fp32, the run uses bf16"),
])
def test_mismatched_family_or_precision_is_refused(fsdp_certificate, plan, precision, reason) -> None:
    with pytest.raises(NotAdmittedError, match=reason):
        prepare(plan, precision=precision, certificate=fsdp_certificate,
                tp_plan={"blocks.*.up": "colwise"} if plan.tp > 1 else None)
    assert not torch.distributed.is_initialized()


def test_unverified_passes_and_the_old_environment_variable_does_not(monkeypatch) -> None:
    with pytest.raises(RuntimeError, match=NO_LAUNCHER):
        prepare(ParallelPlan(dp_shard=2), admission="unverified")
    monkeypatch.setenv("MIXLE_PARALLEL_VERIFYING", "1")  # once admitted anything; now only the harness capability
    with pytest.raises(NotAdmittedError, match="no trusted certificate"):
        prepare(ParallelPlan(dp_shard=2))
    with pytest.raises(ValueError, match="admission='maybe'"):
        prepare(ParallelPlan(dp_shard=2), admission="maybe")


def test_single_process_runs_locally_and_receipts_say_so() -> None:
    session = prepare(ParallelPlan())
    tokens = torch.randint(0, 32, (4, 9), generator=torch.Generator().manual_seed(0))
    receipt = session.train_batch(tokens[:, :-1], tokens[:, 1:])
    assert receipt.extra["admission"] == "local" and receipt.extra["certificate"] == "unverified"
    assert receipt.extra["audited"] is True  # the run's first step is always audited
    # world of one: a same-rank replay and the plain-copy reference, no peer
    assert [(r.replay, r.matched) for r in session.audit_records] == [("same_rank", True), ("reference", True)]
    session.close()


def test_bad_audit_options_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="audit_policy='never'"):
        prepare(ParallelPlan(), audit_policy="never")
    with pytest.raises(ValueError, match="audit_rate=1.5"):
        prepare(ParallelPlan(), audit_rate=1.5)
    with pytest.raises(ValueError, match="audit=True but the in-session SDC audit"):
        prepare(ParallelPlan(cp=2), audit=True, admission="unverified")
    assert not torch.distributed.is_initialized()
