"""The zoo meta-test: every broken backend is refused by verify, certify and conformance, naming the
failed update; every correct neighbour and built-in backend is admitted."""

from __future__ import annotations

from typing import Any

import pytest

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification.admission import CertificationError, certify
from mixle_parallel.verification.conformance.suite import run_conformance
from mixle_parallel.verification.harness.run import verify
from mixle_parallel.verification.harness.worker import resolve_executor
from tests.verification.zoo import ADMITTED, ZOO, Member, register_zoo_backends


def _target(spec: str) -> Any:
    """A registered backend name through the registry (as the CLI resolves it), else the spec itself."""
    if ":" in spec:
        return spec
    import mixle_parallel.executors.estimation  # noqa: F401 - sets the registry's EM verification adapter
    from mixle_parallel.executors.registry import verification_target

    register_zoo_backends()
    return verification_target(spec)


def test_the_zoo_lists_every_bug_of_the_issue():
    bugs = {m.bug for m in ZOO}
    assert len(bugs) == len(ZOO) >= 14
    for words in ("ignores the data", "drops the second half", "drops the last uneven batch", "twice",
                  "not average", "wrong group", "all-gather of one parameter", "never runs",
                  "non-commit micro-steps", "non-deterministic combine order", "only inside the metric all-reduce",
                  "row-parallel layer skips its all-reduce", "under-report the bytes"):
        assert any(words in bug for bug in bugs), words


@pytest.mark.parametrize("member", [pytest.param(m, marks=[pytest.mark.slow] if m.plan.world_size > 2 else [])
                                    for m in ZOO], ids=[m.bug.replace(" ", "_") for m in ZOO])
def test_broken_backend_is_refused_by_verify_certify_and_conformance(member: Member):
    target = _target(member.spec)
    # conformance runs the harness once; verify's report is the one its harness check judged
    results = {r.name: r for r in run_conformance(target, plan=member.plan, precision=member.precision,
                                                  workload=member.workload)}
    harness = results["check_harness_admits"]
    assert not harness.passed and member.update in harness.detail, (member.bug, harness.detail)
    report = harness.report
    assert not report.passed, f"{member.bug}: admitted\n{report.summary()}"
    assert member.checks <= report.failed_checks, (member.bug, report.failures)
    assert any(f"update {member.update!r}" in f for f in report.failures), (member.bug, report.failures)
    with pytest.raises(CertificationError, match=member.update):
        report.certify(target, store=False)
    # the evidence alone (as a third party would hand it to certify) is refused too
    executor = resolve_executor(target)
    with pytest.raises(CertificationError, match=member.update):
        certify(report.evidence, executor=executor, plan=member.plan, precision=member.precision, store=False)


@pytest.mark.parametrize("name, spec, plan, workload, precision", ADMITTED,
                         ids=[a[0].replace(" ", "_") for a in ADMITTED])
def test_correct_neighbours_are_admitted(name: str, spec: str, plan: ParallelPlan, workload: str, precision: str):
    target = _target(spec)
    report = verify(target, plan, precision=precision, workload=workload)
    assert report.passed, f"{name}:\n{report.summary()}"
    report.certify(target, store=False)


@pytest.mark.parametrize("backend", ["local", "mp"])
def test_builtin_em_backends_are_admitted(backend: str):
    import mixle_parallel.executors.estimation  # noqa: F401 - registers the built-in targets
    from mixle_parallel.executors.registry import verification_target

    target = verification_target(backend)
    report = verify(target, ParallelPlan(dp_replicate=2), precision="fp64", workload="gaussian_mixture")
    assert report.passed, report.summary()


def test_builtin_torch_native_is_admitted():
    from mixle_parallel.executors.registry import verification_target

    report = verify(verification_target("torch_native"), ParallelPlan(dp_shard=2), precision="fp32", workload="mlp")
    assert report.passed, report.summary()
