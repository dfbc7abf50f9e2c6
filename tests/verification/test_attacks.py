"""Attacks on admission, each refused with the failed check named (issue 12's list).

Every test gets a fresh trust store (``MIXLE_PARALLEL_HOME`` in a temp dir). "Another machine" is
a second config directory with its own key, as a second ``XDG_CONFIG_HOME`` would be.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import attrs
import pytest

from mixle_parallel.contracts import (
    AdmissionCertificate,
    CertificateEnvelope,
    EnvelopeSignature,
    NotAdmittedError,
    ParallelPlan,
    Tolerance,
    to_dict,
)
from mixle_parallel.verification.admission import certify, require_admission, save_certificate
from mixle_parallel.verification.attestation import open_envelope, sign_certificate
from mixle_parallel.verification.capability import (
    HarnessCapability,
    active_harness_capability,
    harness_admitted,
)
from mixle_parallel.verification.keys import TrustStore, config_home
from tests.verification.vhelpers import StubExecutor, make_evidence


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE", raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _refused(check: str, *args, **kwargs) -> str:
    kwargs.setdefault("world_size", 4)
    with pytest.raises(NotAdmittedError) as caught:
        require_admission(*args, **kwargs)
    text = str(caught.value)
    assert f"check '{check}' failed" in text, text
    return text


def _real(plan, **kwargs) -> tuple[CertificateEnvelope, AdmissionCertificate]:
    envelope = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32", store=False,
                       **kwargs)
    return envelope, open_envelope(envelope)[0]


def _resigned(certificate: AdmissionCertificate) -> CertificateEnvelope:
    """A certificate signed by this machine's own trusted key (a key holder vouching for bad contents)."""
    return sign_certificate(certificate, TrustStore().ensure_signer())


def test_hand_written_certificates_are_refused(plan, tmp_path):
    _, real = _real(plan)
    forged = attrs.evolve(real, evidence_digests=frozenset({"sha256:" + "ab" * 32}),
                          tolerance=Tolerance(atol=1e9, rtol=1e9), issued_at="1999-01-01T00:00:00+00:00")
    text = _refused("signature", StubExecutor(), plan, "fp32", certificate=forged)  # the object itself
    assert "keys init" in text and "mixle-parallel certify" in text
    document = to_dict(forged)
    document["data"]["signature"] = "garbage"  # an old HMAC-era document
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(document))
    assert "older release" in _refused("signature", StubExecutor(), plan, "fp32", certificate=path)
    statement = base64.b64encode(json.dumps({"predicate": to_dict(forged)}).encode()).decode()
    garbage = CertificateEnvelope("application/vnd.in-toto+json", statement,
                                  (EnvelopeSignature("0" * 64, base64.b64encode(b"x" * 64).decode()),))
    _refused("signature", StubExecutor(), plan, "fp32", certificate=garbage)
    text = _refused("evidence_digests", StubExecutor(), plan, "fp32", certificate=_resigned(forged))
    assert "check 'tolerance_policy' failed" in text and "check 'issued_at' failed" in text


def test_one_changed_byte_of_a_real_payload_breaks_the_signature(plan):
    envelope, _ = _real(plan)
    payload = base64.b64decode(envelope.payload)
    positions = range(0, len(payload), max(1, len(payload) // 60))
    for index in positions:
        changed = bytearray(payload)
        changed[index] ^= 0x01
        tampered = attrs.evolve(envelope, payload=base64.b64encode(bytes(changed)).decode())
        text = _refused("signature", StubExecutor(), plan, "fp32", certificate=tampered)
        assert "does not verify" in text
    assert require_admission(StubExecutor(), plan, "fp32", certificate=envelope, world_size=4).certified


def test_another_machines_key_is_refused_until_trusted_and_after_revocation(plan, tmp_path, monkeypatch):
    other = TrustStore(tmp_path / "xdg" / "mixle-parallel")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_home({"XDG_CONFIG_HOME": str(tmp_path / "xdg")}) == other.home
    foreign = certify([make_evidence(plan)], executor=StubExecutor(), plan=plan, precision="fp32",
                      trust_store=other, store=False)
    assert "does not trust" in _refused("signature", StubExecutor(), plan, "fp32", certificate=foreign)
    entry = TrustStore().trust(str(other.public_key_path), label="the other machine")
    assert require_admission(StubExecutor(), plan, "fp32", certificate=foreign, world_size=4).signer == entry.keyid
    TrustStore().revoke(entry.keyid[:12])
    assert "revoked" in _refused("signature", StubExecutor(), plan, "fp32", certificate=foreign)


def test_expired_and_future_dated_certificates_are_refused(plan):
    now = datetime.now(UTC)
    old, _ = _real(plan, issued_at=now - timedelta(days=91))
    assert "more than 90 days ago" in _refused("issued_at", StubExecutor(), plan, "fp32", certificate=old)
    assert require_admission(StubExecutor(), plan, "fp32", certificate=old, world_size=4,
                             max_age=timedelta(days=365)).certified  # the maximum age is configurable
    future, _ = _real(plan, issued_at=now + timedelta(days=1))
    assert "in the future" in _refused("issued_at", StubExecutor(), plan, "fp32", certificate=future)


def test_a_cpu_gloo_certificate_does_not_admit_an_nccl_mesh(plan):
    envelope, cert = _real(plan)
    assert (cert.device_kind, cert.comm_backend) == ("cpu", "gloo")
    text = _refused("device_kind", StubExecutor(), plan, "fp32", certificate=envelope, device_kind="cuda",
                    comm_backend="nccl")
    assert "check 'comm_backend' failed" in text and "runs on cuda" in text
    _refused("device_kind", StubExecutor(), plan, "fp32", certificate=envelope, accelerator=True)


def test_a_modified_executor_cannot_reuse_its_certificate(plan, tmp_path):
    source = tmp_path / "executor_src.py"
    source.write_text("VALUE = 1\n")

    class Pinned(StubExecutor):
        def source_files(self):
            return [source]

    envelope = certify([make_evidence(plan)], executor=Pinned(), plan=plan, precision="fp32", store=False)
    assert require_admission(Pinned(), plan, "fp32", certificate=envelope, world_size=4).certified
    source.write_text("VALUE = 2\n")
    _refused("source_digest", Pinned(), plan, "fp32", certificate=envelope)


def test_the_environment_variable_no_longer_admits(plan, monkeypatch):
    monkeypatch.setenv("MIXLE_PARALLEL_VERIFYING", "1")
    _refused("certificate", StubExecutor(), plan, "fp32")
    assert active_harness_capability() is None
    with pytest.raises(PermissionError, match="capability the verification harness claimed"):
        with harness_admitted(HarnessCapability("mixle_parallel.verification.harness", "guess")):
            pass


def test_the_harness_capability_admits_and_says_so(plan):
    from mixle_parallel.verification.harness import worker

    with harness_admitted(worker._HARNESS):  # the harness's own object (tests reach in; users have no API for it)
        decision = require_admission(StubExecutor(), plan, "fp32", world_size=4)
    assert decision.mode == "verifying"
    assert decision.receipt_extra()["admitted_by"] == "admitted by the harness capability held by " \
        "mixle_parallel.verification.harness"
    with pytest.raises(RuntimeError, match="already claimed"):
        from mixle_parallel.verification.capability import claim_harness_capability

        claim_harness_capability("mixle_parallel.verification.harness")


@pytest.mark.parametrize("mutate", [
    lambda d: d["data"]["signatures"][0].update(sig="sïg=="),  # non-ASCII signature
    lambda d: d["data"]["signatures"][0].update(keyid="\ud800" * 64),  # lone surrogates
    lambda d: d["data"].update(signatures=5),  # wrong type
    lambda d: d["data"].update(payload=None),
    lambda d: d["data"].update(signatures=[]),  # unsigned
    lambda d: d.update(data="[" * 100_000),
    lambda d: d["data"].update(payload_type="text/plain"),
])
def test_malformed_envelopes_are_not_admitted_errors(plan, tmp_path, mutate):
    envelope, _ = _real(plan)
    document = to_dict(envelope)
    mutate(document)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document), encoding="utf-8", errors="surrogatepass")
    _refused("certificate", StubExecutor(), plan, "fp32", certificate=path)


def test_non_utf8_and_deeply_nested_documents_are_not_admitted_errors(plan, tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"kind": "CertificateEnvelope", "data": "\xff\xfe"}')
    _refused("certificate", StubExecutor(), plan, "fp32", certificate=path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    _refused("certificate", StubExecutor(), plan, "fp32", certificate=path)
    save_certificate(_real(plan)[0], path)
    assert require_admission(StubExecutor(), plan, "fp32", certificate=path, world_size=4).certified


def test_a_training_certificate_for_a_different_plan_family_is_refused(plan):
    envelope, _ = _real(plan)
    _refused("plan_family", StubExecutor(), ParallelPlan(dp_shard=4), "fp32", certificate=envelope)
