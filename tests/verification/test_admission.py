"""Admission: certify from evidence into a signed envelope, store and load it, and the gate prepare() calls."""

from __future__ import annotations

import json

import pytest

from mixle_parallel.contracts import (
    AdmissionMode,
    CertificateEnvelope,
    NotAdmittedError,
    ParallelPlan,
    Tolerance,
    from_json,
)
from mixle_parallel.verification.admission import (
    AdmissionDecision,
    AdmissionOptions,
    CertificationError,
    certify,
    load_certificate,
    require_admission,
    save_certificate,
)
from mixle_parallel.verification.attestation import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    current_library_versions,
    executor_source_digest,
    open_envelope,
)
from mixle_parallel.verification.cert_store import CertificateStore
from mixle_parallel.verification.harness.tolerance import compare, default_tolerance, tolerance_policy
from mixle_parallel.verification.keys import TrustStore, load_key
from tests.verification.vhelpers import StubExecutor, make_evidence


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    """A fresh trust store per test."""
    for name in ("MIXLE_PARALLEL_CERTIFICATE", "MIXLE_PARALLEL_VERIFYING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_certify_signs_an_in_toto_statement_binding_the_executor(plan, home):
    executor = StubExecutor()
    evidence = [make_evidence(plan)]
    envelope = certify(evidence, executor=executor, plan=plan, precision="fp32")
    assert isinstance(envelope, CertificateEnvelope) and len(envelope.signatures) == 1
    assert (home / "signing-key.pem").stat().st_mode & 0o777 == 0o600  # made on first use
    cert, keyid = open_envelope(envelope)
    assert keyid == TrustStore().keys()[0].keyid
    assert cert.executor == "stub" and cert.executor_version == "1.0"
    assert cert.source_digest == executor_source_digest(executor)
    assert cert.evidence == tuple(evidence) and cert.evidence_digests == frozenset({evidence[0].evidence_id})
    assert (cert.device_kind, cert.comm_backend) == ("cpu", "gloo")
    assert {"python", "numpy", "torch"} <= set(cert.library_versions) == set(current_library_versions())
    import base64

    statement = json.loads(base64.b64decode(envelope.payload))
    assert statement["_type"] == STATEMENT_TYPE and statement["predicateType"] == PREDICATE_TYPE
    assert statement["subject"][0]["name"] == "stub@1.0"
    assert "sha256:" + statement["subject"][0]["digest"]["sha256"] == cert.source_digest
    stored = CertificateStore().entries()
    assert [c.certificate_id for _, c, _ in stored] == [cert.certificate_id]


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


def test_saved_certificate_round_trips_and_admits(tmp_path, plan):
    envelope = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32")
    path = save_certificate(envelope, tmp_path / "c" / "cert.json")
    assert load_certificate(path) == envelope
    assert from_json(path.read_text(), CertificateEnvelope) == envelope
    decision = require_admission(StubExecutor(), plan, "fp32", certificate=path, world_size=4)
    cert, keyid = open_envelope(envelope)
    assert decision.certified and decision.ledger_link == cert.certificate_id and decision.signer == keyid
    assert decision.receipt_extra() == {"admission": "certified", "certificate": cert.certificate_id}


def test_gate_on_a_real_mesh_without_a_stored_certificate_names_the_certify_command(plan):
    with pytest.raises(NotAdmittedError) as caught:
        require_admission(StubExecutor(), plan, "fp32", world_size=4)
    text = str(caught.value)
    assert "check 'certificate' failed: no trusted certificate in" in text
    assert "`mixle-parallel certify --backend stub --plan dp_shard=2,tp=2 --precision fp32 --out cert.json`" in text
    with pytest.raises(NotAdmittedError, match="cuda/nccl"):
        require_admission(StubExecutor(), ParallelPlan(), "fp32", world_size=1, accelerator=True)


def test_automatic_admission_finds_a_fitting_stored_certificate(plan):
    envelope = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32")
    decision = require_admission(StubExecutor(), ParallelPlan(dp_shard=4, tp=2), "fp32", world_size=8)
    assert decision.certified and decision.certificate_id == open_envelope(envelope)[0].certificate_id
    assert "local store" in decision.notes[0]
    with pytest.raises(NotAdmittedError, match="no trusted certificate"):  # bf16: nothing fits
        require_admission(StubExecutor(), plan, "bf16", world_size=4)


def test_automatic_certification_runs_once_and_is_stored(plan, capsys):
    calls = []

    def auto():
        calls.append(1)
        return certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32", store=False)

    first = require_admission(StubExecutor(), plan, "fp32", world_size=4, auto_certify=auto)
    assert first.certified and "certified on the spot" in first.notes[0]
    assert capsys.readouterr().err.count("certifying stub") == 1
    second = require_admission(StubExecutor(), plan, "fp32", world_size=4, auto_certify=auto)
    assert second.certificate_id == first.certificate_id and len(calls) == 1


def test_gate_names_every_mismatch(plan):
    envelope = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32")
    with pytest.raises(NotAdmittedError) as caught:
        require_admission(StubExecutor(version="2.0"), ParallelPlan(dp_shard=4), "bf16", certificate=envelope,
                          world_size=4)
    text = str(caught.value)
    for check in ("executor_version", "plan_family", "precision"):
        assert f"check '{check}' failed" in text
    assert "stub 1.0, running 2.0" in text and "the plan uses ['dp_shard']" in text


def test_gate_library_version_mismatch(plan):
    envelope = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32")
    with pytest.raises(NotAdmittedError, match=r"check 'library_versions' failed: .*numpy \S+, running 0.0.1"):
        require_admission(StubExecutor(), plan, "fp32", certificate=envelope, world_size=4,
                          library_versions={"numpy": "0.0.1"})
    with pytest.raises(NotAdmittedError, match="loads megatron-core 0.1, which the certificate does not name"):
        require_admission(StubExecutor(), plan, "fp32", certificate=envelope, world_size=4,
                          library_versions={"megatron-core": "0.1"})


def test_unverified_local_and_one_argument_forms(plan, monkeypatch, tmp_path):
    decision = require_admission(StubExecutor(), plan, "fp32", admission="unverified", world_size=4)
    assert decision.mode == "unverified" and decision.receipt_extra()["certificate"] == "unverified"
    assert require_admission(StubExecutor(), ParallelPlan(), "fp32", world_size=1).mode == "local"
    envelope = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32", store=False)
    assert require_admission(StubExecutor(), plan, "fp32", admission=envelope, world_size=4).certified
    path = save_certificate(envelope, tmp_path / "one.json")
    assert require_admission(StubExecutor(), plan, "fp32", admission=str(path), world_size=4).certified
    with pytest.raises(ValueError, match="pass the certificate once"):
        require_admission(StubExecutor(), plan, "fp32", admission=envelope, certificate=envelope, world_size=4)
    with pytest.raises(ValueError, match="admission=3"):
        require_admission(StubExecutor(), plan, "fp32", admission=3, world_size=4)
    monkeypatch.setenv("MIXLE_PARALLEL_CERTIFICATE", str(path))
    assert require_admission(StubExecutor(), plan, "fp32", world_size=4).certified


def test_ledger_hmac_key_loading(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_key(key_file=tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_key(key_file=empty)
    assert load_key(environ={}) is None
    assert load_key(purpose="ledger", environ={"MIXLE_PARALLEL_LEDGER_KEY": "abc"}) == b"abc"
    with pytest.raises(ValueError, match="Ed25519"):
        load_key(purpose="cert")


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


def test_the_gate_takes_an_options_object_or_its_fields_as_keywords(plan):
    envelope = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32", store=False)
    by_options = require_admission(StubExecutor(), plan, "fp32", AdmissionOptions(certificate=envelope),
                                   world_size=4)
    by_keywords = require_admission(StubExecutor(), plan, "fp32", certificate=envelope, world_size=4)
    assert by_options == by_keywords and by_options.mode is AdmissionMode.CERTIFIED
    with pytest.raises(TypeError, match=r"unknown option\(s\) certificat; .*AdmissionOptions fields: certificate,"):
        require_admission(StubExecutor(), plan, "fp32", certificat=envelope, world_size=4)
    with pytest.raises(TypeError, match="not both"):
        require_admission(StubExecutor(), plan, "fp32", AdmissionOptions(), certificate=envelope, world_size=4)
    with pytest.raises(TypeError, match="'device_kind' must be"):
        AdmissionOptions(device_kind=3)
    with pytest.raises(TypeError, match="'trust_store' must be"):
        AdmissionOptions(trust_store="home")
    with pytest.raises(NotAdmittedError, match="cuda/nccl"):  # comm_backend_for(cuda) when none is named
        require_admission(StubExecutor(), ParallelPlan(), "fp32", AdmissionOptions(device_kind="cuda"), world_size=1)


def test_decisions_carry_admission_modes_and_receipts_their_text(plan):
    local = require_admission(StubExecutor(), ParallelPlan(), "fp32", world_size=1)
    assert local.mode is AdmissionMode.LOCAL and local.receipt_extra() == {"admission": "local",
                                                                           "certificate": "unverified"}
    assert type(local.receipt_extra()["admission"]) is str  # plain text in receipts and ledgers
    assert AdmissionDecision("unverified").mode is AdmissionMode.UNVERIFIED
    with pytest.raises(ValueError, match="AdmissionDecision.mode='trusted' is not one of 'certified'"):
        AdmissionDecision("trusted")
