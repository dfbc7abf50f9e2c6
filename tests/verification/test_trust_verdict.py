"""The gate re-derives the verdict from the evidence (issue 23 item 4): a signature alone admits nothing.

Each certificate here is signed by this machine's own trusted key (a key holder vouching for bad
contents); before this change each was admitted.
"""

from __future__ import annotations

import attrs
import pytest

from mixle_parallel.contracts import AdmissionCertificate, NotAdmittedError, NumericsEvidence, ParallelPlan
from mixle_parallel.verification.admission import certify, require_admission
from mixle_parallel.verification.attestation import open_envelope, sign_certificate
from mixle_parallel.verification.keys import TrustStore
from tests.verification.vhelpers import StubExecutor, make_evidence

PLAN = ParallelPlan(dp_shard=2, tp=2)


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE", raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _honest() -> AdmissionCertificate:
    envelope = certify([make_evidence(PLAN)], executor=StubExecutor(), plan=PLAN, precision="fp32", store=False)
    return open_envelope(envelope)[0]


def _signed_with(*records: NumericsEvidence):
    certificate = attrs.evolve(_honest(), evidence=records,
                               evidence_digests=frozenset(r.evidence_id for r in records))
    return sign_certificate(certificate, TrustStore().ensure_signer())


def _refused(envelope, check: str) -> str:
    with pytest.raises(NotAdmittedError) as caught:
        require_admission(StubExecutor(), PLAN, "fp32", certificate=envelope, world_size=4)
    text = str(caught.value)
    assert f"check '{check}' failed" in text, text
    return text


def test_an_honest_certificate_is_admitted():
    assert require_admission(StubExecutor(), PLAN, "fp32", certificate=_signed_with(make_evidence(PLAN)),
                             world_size=4).certified


def test_evidence_that_says_1e300_passed_is_refused():
    lie = attrs.evolve(make_evidence(PLAN), maximum_absolute_error=1e300, maximum_relative_error=1e300)
    assert lie.within_tolerance
    text = _refused(_signed_with(lie), "evidence")
    assert "max abs error 1e+300 cannot pass" in text and "contradicts its own numbers" in text


def test_a_claimed_reference_magnitude_must_agree_with_the_relative_error():
    tight = attrs.evolve(make_evidence(PLAN), maximum_absolute_error=1e300, maximum_relative_error=1e-7,
                         reference_magnitude=1e306)
    assert "the record contradicts itself" in _refused(_signed_with(tight), "evidence")


def test_evidence_only_for_an_undeclared_update_is_refused():
    text = _refused(_signed_with(make_evidence(PLAN, node_id="grad:elsewhere")), "declared_updates")
    assert "declared update 'grad:dp_shard'" in text and "has no evidence record" in text
    assert "evidence record 'grad:elsewhere' is for an update stub does not declare" in text


def test_an_extra_record_for_an_undeclared_update_is_refused():
    text = _refused(_signed_with(make_evidence(PLAN), make_evidence(PLAN, node_id="grad:extra")),
                    "declared_updates")
    assert "'grad:extra' is for an update stub does not declare" in text


def test_the_harness_records_the_reference_magnitude():
    import numpy as np

    from mixle_parallel.contracts import Tolerance
    from mixle_parallel.verification.harness.tolerance import compare

    result = compare(np.array([1.0, -3.0]), np.array([1.0, -3.0 + 1e-7]), Tolerance(atol=1e-5, rtol=1e-6))
    assert result.within and result.reference_magnitude == pytest.approx(3.0)
