"""EM backends through the harness: statistics bitwise equal to one worker, certified, contract checks pass."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification.attestation import read_unverified
from mixle_parallel.verification.conformance.suite import main_conformance
from mixle_parallel.verification.harness.em_reference import EM_REFERENCE_TOLERANCE
from mixle_parallel.verification.harness.run import verify
from tests.verification.vhelpers import admits


@pytest.mark.parametrize("backend", ["local", "mp"])
def test_em_backend_statistics_are_bitwise_and_certified(backend):
    from mixle_parallel.executors.estimation.admission.harness_adapter import VerifiableEncodedData, em_capabilities

    executor = VerifiableEncodedData(backend)
    report = verify(executor, ParallelPlan(dp_replicate=2), precision="fp64", workload="gaussian_mixture")
    assert report.passed, report.summary()
    evidence = report.evidence[0]
    # against the one-piece numpy reference: within the stated fp64 bound, not bitwise (other sum order)
    assert evidence.tolerance == EM_REFERENCE_TOLERANCE
    assert 0.0 < evidence.maximum_relative_error < 1e-12
    assert "bitwise equal to the same executor on one worker" in evidence.notes
    cert = report.certify(executor)
    assert read_unverified(cert).capabilities == em_capabilities(backend)
    assert admits(cert, executor, ParallelPlan(dp_replicate=3), "fp64") == read_unverified(cert).certificate_id


def test_em_backend_passes_the_conformance_suite(capsys):
    target = "mixle_parallel.executors.estimation.admission.harness_adapter:VerifiableEncodedData"
    code = main_conformance(["--backend", target, "--plan", "dp_replicate=2"])
    assert code == 0, capsys.readouterr().out
