"""SDC audit primitives: bit flips, digests, the seeded schedule, replay verdicts and policies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from mixle_parallel.verification.sdc.digest import digest, max_abs_difference
from mixle_parallel.verification.sdc.inject import BitFlip, FaultInjector, flip_bit
from mixle_parallel.verification.sdc.training import AuditSchedule, SDCDetectedError, TrainingAuditor


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.uint8])
def test_flip_bit_numpy_every_width_round_trips(dtype):
    value = np.arange(1, 7, dtype=dtype)
    before = digest(value)
    width = value.dtype.itemsize * 8
    for bit in (0, width // 2, width - 1):
        flip_bit(value, 3, bit)
        assert digest(value) != before
        flip_bit(value, 3, bit)
        assert digest(value) == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64])
def test_flip_bit_torch_every_width_round_trips(dtype):
    tensor = torch.arange(1, 7).to(dtype)
    before, original = digest(tensor), tensor.clone()
    width = tensor.element_size() * 8
    for bit in (0, width - 2, width - 1):
        flip_bit(tensor, 2, bit)
        assert digest(tensor) != before
        assert (tensor != original).sum().item() == 1
        flip_bit(tensor, 2, bit)
        assert torch.equal(tensor, original)


def test_flip_sign_bit_of_float32_negates():
    value = np.array([1.5, 2.0], dtype=np.float32)
    flip_bit(value, 1, 31)
    assert value[1] == -2.0
    grad = torch.ones(3, requires_grad=True)
    flip_bit(grad, 0, 31)
    assert grad[0].item() == -1.0


def test_flip_bit_errors_name_the_problem():
    with pytest.raises(IndexError, match="element 9"):
        flip_bit(np.zeros(3), 9, 0)
    with pytest.raises(IndexError, match="bit 64"):
        flip_bit(np.zeros(3), 0, 64)
    with pytest.raises(ValueError, match="contiguous"):
        flip_bit(torch.zeros(3, 4).t(), 0, 0)
    with pytest.raises(TypeError, match="numpy arrays and torch tensors"):
        flip_bit([1.0], 0, 0)
    with pytest.raises(ValueError, match="BitFlip.kind"):
        BitFlip("weights", "w", 0, 0)


def test_injector_strikes_once_at_the_planned_rank_and_step():
    injector = FaultInjector([BitFlip("gradient", "w", rank=1, step=3, index=2, bit=30)])
    grads = {"w": np.ones(4, dtype=np.float32), "b": np.ones(1, dtype=np.float32)}
    assert injector.apply_all("gradient", grads, rank=0, step=3) == ()
    assert injector.apply_all("gradient", grads, rank=1, step=2) == ()
    assert injector.apply_all("gradient", grads, rank=1, step=3) == ("w",)
    assert grads["w"][2] != 1.0 and injector.pending == () and len(injector.applied) == 1
    assert injector.apply_all("gradient", grads, rank=1, step=3) == ()


def test_digest_covers_dtype_shape_and_structure():
    a = np.zeros(4, dtype=np.float32)
    assert digest(a) != digest(a.astype(np.float64)) != digest(a.reshape(2, 2))
    assert digest({"x": a, "y": 1}) == digest({"y": 1, "x": a.copy()})
    assert digest(torch.zeros(4)) == digest(torch.zeros(4))
    assert max_abs_difference({"x": a}, {"x": a + 0.5}) == 0.5
    assert max_abs_difference({"x": a}, {"z": a}) == float("inf")


def test_schedule_is_seeded_identical_everywhere_and_audits_the_first_step():
    schedule = AuditSchedule(rate=0.05, seed=7, first_step=100)
    assert schedule.is_audited(100)
    assert schedule.audited_steps(0, 500) == AuditSchedule(rate=0.05, seed=7, first_step=100).audited_steps(0, 500)
    assert schedule.audited_steps(0, 500) != AuditSchedule(rate=0.05, seed=8, first_step=100).audited_steps(0, 500)
    # the audited fraction matches the rate: two-sided exact binomial test, 99.9% confidence
    hits = len(AuditSchedule(rate=0.05, seed=3, first_step=None).audited_steps(0, 20_000))
    assert binomtest(hits, 20_000, 0.05).pvalue > 1e-3
    with pytest.raises(ValueError, match="rate"):
        AuditSchedule(rate=1.5)


def _grads(value: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": np.full(3, value, dtype=np.float32)}


def test_policies_warn_skip_and_raise():
    bad = _grads()
    flip_bit(bad["w"], 0, 3)
    warn = TrainingAuditor(policy="warn").audit(step=0, rank=2, observed=bad, recompute=_grads)
    assert not warn.skip and warn.attributed_ranks == {2} and warn.mismatched[0].action == "warn"
    skip = TrainingAuditor(policy="skip_step").audit(step=0, rank=2, observed=bad, recompute=_grads)
    assert skip.skip and skip.mismatched[0].action == "skip_step"
    with pytest.raises(SDCDetectedError, match="step 0 on rank 2"):
        TrainingAuditor(policy="raise").audit(step=0, rank=2, observed=bad, recompute=_grads)
    deferred = TrainingAuditor(policy="raise").audit(step=0, rank=2, observed=bad, recompute=_grads, defer_policy=True)
    assert deferred.mismatched
    clean = TrainingAuditor(policy="raise").audit(step=0, rank=2, observed=_grads(), recompute=_grads)
    assert clean.records[0].matched and not clean.skip
    with pytest.raises(ValueError, match="audit policy"):
        TrainingAuditor(policy="ignore")


def test_bounded_comparison_tolerates_small_differences_only():
    auditor = TrainingAuditor(bound=1e-3)
    near = auditor.audit(step=1, rank=0, observed=_grads(1.0005), recompute=_grads)
    assert near.records[0].matched and near.records[0].maximum_absolute_difference == pytest.approx(5e-4, rel=1e-2)
    far = auditor.audit(step=1, rank=0, observed=_grads(1.01), recompute=_grads)
    assert not far.records[0].matched


def test_audit_policies_are_the_contracts_vocabulary():
    from mixle_parallel.contracts import EM_AUDIT_POLICIES, TRAINING_AUDIT_POLICIES, AuditPolicy
    from mixle_parallel.verification import AUDIT_POLICIES
    from mixle_parallel.verification.sdc.em import EMAuditor

    assert AUDIT_POLICIES == TRAINING_AUDIT_POLICIES  # the earlier public name, same members
    assert EMAuditor(policy="warn").policy is AuditPolicy.WARN
    assert EMAuditor(policy=AuditPolicy.RAISE).policy is AuditPolicy.RAISE
    assert {p.value for p in EM_AUDIT_POLICIES} == {"quarantine", "raise", "warn"}
    with pytest.raises(ValueError, match="EMAuditor policy='skip_step' is not one of 'quarantine', 'raise', 'warn'"):
        EMAuditor(policy="skip_step")  # a training policy, not an EM one
