"""A certificate binds the accumulation window it measured (issue 23 item 3a).

The gate admits a plan's ``gradient_accumulation_steps`` / ``microbatches`` only when the certificate
measured a window that covers them (a measured 1 covers only 1, a measured k > 1 covers any size > 1),
and every data-parallel certification measures such a window.
"""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan, window_covers
from mixle_parallel.verification.admission import certify, require_admission
from mixle_parallel.verification.harness.window import measured_window
from mixle_parallel.verification.harness.workloads import GaussianMixtureWorkload, MLPWorkload, TinyLMWorkload
from tests.verification.vhelpers import StubExecutor, make_evidence

DP2 = ParallelPlan(dp_shard=2)
BIG = ParallelPlan(dp_shard=8, gradient_accumulation_steps=4, microbatches=4)


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    """A fresh trust store per test."""
    for name in ("MIXLE_PARALLEL_CERTIFICATE", "MIXLE_PARALLEL_VERIFYING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _certificate(measured: ParallelPlan, evidence_plan: ParallelPlan | None = None):
    stub = StubExecutor(axes=("dp_shard",))
    return certify([make_evidence(evidence_plan or measured)], executor=stub, plan=measured, precision="fp32",
                   store=False)


def _admit(envelope, plan: ParallelPlan):
    return require_admission(StubExecutor(axes=("dp_shard",)), plan, "fp32", certificate=envelope, world_size=8)


def test_the_window_rule():
    assert window_covers(1, 1) and window_covers(2, 1) and window_covers(2, 2) and window_covers(2, 64)
    assert not window_covers(1, 2) and not window_covers(1, 4)


def test_a_certificate_without_a_measured_window_refuses_an_accumulating_plan():
    old = _certificate(DP2)  # what every dp certificate was before: one call of one micro-batch
    assert _admit(old, ParallelPlan(dp_shard=8)).certified  # a plan without accumulation is still admitted
    with pytest.raises(NotAdmittedError) as caught:
        _admit(old, BIG)
    text = str(caught.value)
    assert "check 'accumulation' failed: the plan asks for gradient_accumulation_steps=4" in text
    assert "check 'accumulation' failed: the plan asks for microbatches=4" in text
    assert ("re-certify: `mixle-parallel certify --backend stub --plan dp_shard=8,gradient_accumulation_steps=4,"
            "microbatches=4 --precision fp32`") in text
    with pytest.raises(NotAdmittedError, match="microbatches=2") as only_micro:
        _admit(old, ParallelPlan(dp_shard=8, microbatches=2))
    assert "gradient_accumulation_steps" not in str(only_micro.value)


def test_a_measured_window_covers_every_larger_window_and_none():
    window = _certificate(ParallelPlan(dp_shard=2, gradient_accumulation_steps=2, microbatches=2))
    assert _admit(window, BIG).certified
    assert _admit(window, ParallelPlan(dp_shard=8)).certified


def test_a_measured_plan_whose_evidence_ran_no_window_is_refused():
    claimed = ParallelPlan(dp_shard=2, gradient_accumulation_steps=2, microbatches=2)
    forged = _certificate(claimed, evidence_plan=DP2)  # the label says 2, the evidence ran 1
    with pytest.raises(NotAdmittedError, match="check 'accumulation' failed"):
        _admit(forged, BIG)


def test_the_gate_refusal_without_a_certificate_names_the_window_to_certify():
    with pytest.raises(NotAdmittedError, match="--plan dp_shard=8,gradient_accumulation_steps=4,microbatches=4 "):
        require_admission(StubExecutor(axes=("dp_shard",)), BIG, "fp32", world_size=8)


def test_the_harness_widens_data_parallel_training_plans_to_a_window():
    plan, work = measured_window(DP2, MLPWorkload())
    assert (plan.dp_shard, plan.gradient_accumulation_steps, plan.microbatches) == (2, 2, 2)
    assert work.batch == 16  # 2 ranks x 2 calls x 2 micro-batches divide it already
    plan, work = measured_window(ParallelPlan(dp_replicate=2, dp_shard=2), TinyLMWorkload())
    assert work.batch == 16  # 8 rows cannot give 4 ranks 2 calls of 2 micro-batches: grown to 16
    bigger = ParallelPlan(dp_shard=2, gradient_accumulation_steps=3)
    assert measured_window(bigger, MLPWorkload())[0].gradient_accumulation_steps == 3  # a larger ask is kept
    for plan, work in ((ParallelPlan(tp=2), MLPWorkload()), (ParallelPlan(dp_replicate=2), GaussianMixtureWorkload())):
        assert measured_window(plan, work) == (plan, work)  # no data parallelism / EM: no window to measure


@pytest.mark.slow
def test_a_dp2_certification_catches_a_bug_that_only_accumulation_shows():
    from mixle_parallel.verification.harness.run import verify

    broken = verify("tests.verification.zoo:BrokenNoSyncDDP", DP2, precision="fp32", workload="mlp")
    assert not broken.passed and "collectives" in broken.failed_checks  # on dp_shard=2 alone it passed before
    assert broken.plan == ParallelPlan(dp_shard=2, gradient_accumulation_steps=2, microbatches=2)
    correct = verify("tests.verification.zoo:AccumulatingDDP", DP2, precision="fp32", workload="mlp")
    assert correct.passed, correct.summary()
    assert "accumulation window 2 calls x 2 micro-batches" in correct.summary()
