"""Admission: certify from evidence, sign, save/load, and the gate executors call in prepare()."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan, Tolerance, check_admission
from mixle_parallel.verification.admission import (
    CertificationError,
    certify,
    is_verifying,
    load_certificate,
    require_admission,
    save_certificate,
    verifying,
)
from mixle_parallel.verification.harness.tolerance import compare, default_tolerance, tolerance_policy
from mixle_parallel.verification.keys import load_key
from tests.verification.vhelpers import StubExecutor, make_evidence

KEY = b"cert-test-key"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("MIXLE_PARALLEL_CERT_KEY", "MIXLE_PARALLEL_CERT_KEY_FILE", "MIXLE_PARALLEL_CERTIFICATE",
                 "MIXLE_PARALLEL_VERIFYING"):
        monkeypatch.delenv(name, raising=False)


def test_certify_binds_executor_plan_precision_evidence(plan):
    executor = StubExecutor()
    evidence = [make_evidence(plan)]
    cert = certify(evidence, executor=executor, plan=plan, precision="fp32")
    assert cert.executor == "stub" and cert.executor_version == "1.0"
    assert cert.evidence_digests == frozenset({evidence[0].evidence_id})
    assert cert.signature is None
    assert check_admission(cert, executor, ParallelPlan(dp_shard=4, tp=2), "fp32") == cert.certificate_id


@pytest.mark.parametrize("kwargs, check", [
    ({"within": False}, "check 'numerics' failed"),
    ({"deterministic": False}, "check 'determinism' failed"),
    ({"collectives": False}, "check 'collectives' failed"),
    ({"node_id": "other"}, "declared update 'grad:dp_shard' has no evidence"),
    ({"precision": "bf16"}, "measured at bf16"),
])
def test_certify_refuses_failing_evidence_naming_the_check(plan, kwargs, check):
    with pytest.raises(CertificationError, match=check):
        certify([make_evidence(plan, **kwargs)], executor=StubExecutor(), plan=plan, precision="fp32")


def test_certify_refuses_a_plan_the_backend_cannot_run(plan):
    with pytest.raises(CertificationError, match="does not execute axis pp"):
        certify([make_evidence(ParallelPlan(pp=2))], executor=StubExecutor(), plan=ParallelPlan(pp=2), precision="fp32")


def test_signed_certificate_round_trips_and_verifies(tmp_path, plan, monkeypatch):
    key_file = tmp_path / "cert.key"
    key_file.write_text("hex:" + KEY.hex() + "\n")
    monkeypatch.setenv("MIXLE_PARALLEL_CERT_KEY_FILE", str(key_file))
    assert load_key() == KEY
    cert = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32")
    assert cert.signature_valid(KEY)
    path = save_certificate(cert, tmp_path / "c" / "cert.json")
    again = load_certificate(path)
    assert again == cert and again.certificate_id == cert.certificate_id
    decision = require_admission(StubExecutor(), plan, "fp32", certificate=path, world_size=4, accelerator=False)
    assert decision.certified and decision.ledger_link == cert.certificate_id
    assert decision.receipt_extra() == {"admission": "certified", "certificate": cert.certificate_id}
    monkeypatch.setenv("MIXLE_PARALLEL_CERT_KEY", "another key")
    monkeypatch.delenv("MIXLE_PARALLEL_CERT_KEY_FILE")
    with pytest.raises(NotAdmittedError, match="signature does not verify"):
        require_admission(StubExecutor(), plan, "fp32", certificate=cert, world_size=4, accelerator=False)


def test_gate_on_a_real_mesh_requires_a_certificate(plan):
    with pytest.raises(NotAdmittedError, match="no admission certificate .* real device mesh"):
        require_admission(StubExecutor(), plan, "fp32", world_size=4, accelerator=False)
    with pytest.raises(NotAdmittedError, match="accelerator"):
        require_admission(StubExecutor(), ParallelPlan(), "fp32", world_size=1, accelerator=True)


def test_gate_names_every_mismatch(plan):
    cert = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32")
    with pytest.raises(NotAdmittedError) as caught:
        require_admission(StubExecutor(version="2.0"), ParallelPlan(dp_shard=4), "bf16", certificate=cert,
                          world_size=4, accelerator=False)
    text = str(caught.value)
    assert "version 1.0, running 2.0" in text and "the plan uses ['dp_shard']" in text and "precision fp32" in text


def test_gate_library_version_mismatch(plan):
    cert = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32",
                   library_versions={"torch": "2.0"})
    with pytest.raises(NotAdmittedError, match="measured with torch 2.0, running 9.9"):
        require_admission(StubExecutor(), plan, "fp32", certificate=cert, world_size=4, accelerator=False,
                          library_versions={"torch": "9.9"})


def test_unverified_local_and_verifying_modes(plan, monkeypatch, tmp_path):
    decision = require_admission(StubExecutor(), plan, "fp32", admission="unverified", world_size=4, accelerator=False)
    assert decision.mode == "unverified" and decision.receipt_extra()["certificate"] == "unverified"
    assert require_admission(StubExecutor(), ParallelPlan(), "fp32", world_size=1, accelerator=False).mode == "local"
    assert not is_verifying()
    with verifying():
        assert is_verifying()
        assert require_admission(StubExecutor(), plan, "fp32", world_size=4, accelerator=False).mode == "verifying"
    assert not is_verifying()
    cert = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32")
    one_argument = require_admission(StubExecutor(), plan, "fp32", admission=cert, world_size=4, accelerator=False)
    assert one_argument.certified
    path = save_certificate(cert, tmp_path / "one.json")
    assert require_admission(
        StubExecutor(), plan, "fp32", admission=str(path), world_size=4, accelerator=False
    ).certified
    with pytest.raises(ValueError, match="pass the certificate once"):
        require_admission(
            StubExecutor(), plan, "fp32", admission=cert, certificate=cert, world_size=4, accelerator=False
        )
    with pytest.raises(ValueError, match="admission='maybe'"):
        require_admission(StubExecutor(), plan, "fp32", admission="maybe", world_size=4, accelerator=False)
    monkeypatch.setenv("MIXLE_PARALLEL_CERTIFICATE", str(save_certificate(cert, tmp_path / "cert.json")))
    assert require_admission(StubExecutor(), plan, "fp32", world_size=4, accelerator=False).certified


def test_key_loading_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_key(key_file=tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_key(key_file=empty)
    assert load_key(environ={}) is None
    assert load_key(purpose="ledger", environ={"MIXLE_PARALLEL_LEDGER_KEY": "abc"}) == b"abc"


def test_default_tolerances_follow_torch_testing():
    assert (default_tolerance("fp32").rtol, default_tolerance("fp32").atol) == (1.3e-6, 1e-5)
    assert (default_tolerance("bf16").rtol, default_tolerance("bf16").atol) == (1.6e-2, 1e-5)
    assert (default_tolerance("fp16").rtol, default_tolerance("fp16").atol) == (1e-3, 1e-5)
    assert (default_tolerance("fp64").rtol, default_tolerance("fp64").atol) == (1e-7, 1e-7)
    em = default_tolerance("fp64", family="em")  # against the one-piece reference; worker counts are bitwise
    assert not em.bitwise and (em.atol, em.rtol) == (1e-9, 1e-9) and "one-piece reference" in em.source
    assert "torch.testing" in default_tolerance("fp32").source
    with pytest.raises(ValueError, match="no default tolerance for precision 'fp8'"):
        default_tolerance("fp8")
    assert set(tolerance_policy()) == {"bf16", "em", "fp16", "fp32", "fp64", "tf32"}


def test_compare_matches_torch_testing_rule():
    import numpy as np
    import torch

    expected = np.array([1.0, -2.0, 1e-9], dtype=np.float32)
    tol = default_tolerance("fp32")
    near = expected + np.array([1.2e-6, 0, 9e-6], dtype=np.float32)
    result = compare(near, expected, tol)
    assert result.within and not result.bitwise_equal
    torch.testing.assert_close(torch.from_numpy(near), torch.from_numpy(expected))
    far = expected + np.array([0, 0, 2e-5], dtype=np.float32)
    assert not compare(far, expected, tol).within
    with pytest.raises(AssertionError):
        torch.testing.assert_close(torch.from_numpy(far), torch.from_numpy(expected))
    assert compare(expected, expected.copy(), Tolerance.exact()).within
    assert not compare(near, expected, Tolerance.exact()).within
    nan = compare(np.array([np.nan]), np.array([1.0]), tol)
    assert not nan.within and nan.maximum_absolute_error == float("inf")
