"""The rank comparison training and EM share (issue 34 item 6), in one process: views exchanged by a list.

The exchange here returns the other ranks' views as a launched run's collective would; the launched runs
themselves are tested with real processes (tests/launchers/test_rank_agreement.py,
tests/estimation/backends/test_em_rank_agreement.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mixle_parallel.contracts import AdmissionMode, NotAdmittedError
from mixle_parallel.verification.admission import AdmissionDecision, AutoCertify
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.rank_agreement import AdmissionView, admission_view, agreed_decision

CERTIFIED = AdmissionDecision(AdmissionMode.CERTIFIED, "sha256:" + "ab" * 32)


def _exchange(others: Sequence[AdmissionView]):
    def exchange(view: AdmissionView) -> list[AdmissionView]:
        return [view, *others]
    return exchange


def _refusing(calls: list[AutoCertify | None]):
    def gate(auto: AutoCertify | None) -> AdmissionDecision:
        calls.append(auto)
        if auto is not None:
            return CERTIFIED  # certified in situ
        raise NotAdmittedError("check 'certificate' failed: no trusted certificate fits")
    return gate


def test_ranks_sharing_a_view_follow_the_decision() -> None:
    decision = agreed_decision(lambda auto: CERTIFIED, None, _exchange([admission_view(CERTIFIED, None, False)]))
    assert decision is CERTIFIED


def test_a_rank_with_another_view_stops_every_rank_naming_each_view(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path))
    calls: list[AutoCertify | None] = []
    with pytest.raises(NotAdmittedError) as info:  # this rank would certify; rank 1 holds a certificate
        agreed_decision(_refusing(calls), lambda: None, _exchange([admission_view(CERTIFIED, None, False)]))
    text = str(info.value)
    assert "check 'agreement' failed" in text
    assert "rank 0: refused (certificate; would certify in situ)" in text
    assert "rank 1: certified under certificate sha256:abababababab..." in text
    assert calls == [None]  # never asked to certify


def test_in_situ_certification_starts_only_if_every_rank_may_certify(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path))
    refused = NotAdmittedError("check 'certificate' failed: no trusted certificate fits")
    calls: list[AutoCertify | None] = []
    certifier: AutoCertify = lambda: None  # noqa: E731 - never called: the gate stands in for certifying
    everyone = _exchange([admission_view(None, refused, True)])
    assert agreed_decision(_refusing(calls), certifier, everyone) is CERTIFIED
    assert calls == [None, certifier]  # decided without certifying, then certified with every rank

    TrustStore(tmp_path).set_policy("off")  # this rank may not certify; rank 1 may
    calls.clear()
    with pytest.raises(NotAdmittedError, match="rank 0: refused \\(certificate; may not certify in situ\\)"):
        agreed_decision(_refusing(calls), certifier, everyone)
    assert calls == [None]
