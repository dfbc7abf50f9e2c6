"""Single-process checks of the tensor-parallel audit's plain reference (``executors/torch/sdc_tp_reference``):
which plans it covers, when it is skipped and why, its tolerance, and how a failed comparison gets its cause.
The real comparisons run in ``test_sdc_audit.py`` (tp=2 on 2 gloo ranks, dp_shard=2 x tp=2 on 4)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mixle_parallel.contracts import ParallelPlan, SDCAuditRecord
from mixle_parallel.executors.torch import sdc_tp_reference as ref
from mixle_parallel.executors.torch.dp_mode import DataParallelMode
from mixle_parallel.executors.torch.sdc_audit import resolve_audit, sharded_reference_template
from mixle_parallel.executors.training_options import AuditOptions
from mixle_parallel.verification.harness.tolerance import default_tolerance
from tests.torch._models import make_model

SHA = "sha256:" + "0" * 64


def test_the_reference_covers_tensor_parallelism_beside_data_parallel_axes_only() -> None:
    assert ref.tp_reference_applies(ParallelPlan(tp=2))
    assert ref.tp_reference_applies(ParallelPlan(dp_shard=2, tp=2))
    assert not ref.tp_reference_applies(ParallelPlan(dp_shard=2))  # sdc_reference's plain copy, bitwise
    assert not ref.tp_reference_applies(ParallelPlan(tp=2, cp=2))
    assert not ref.tp_reference_applies(ParallelPlan(tp=2, pp=2))


def test_dp_replicate_by_tp_without_dp_shard_refuses_the_audit_instead_of_comparing_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    plan = ParallelPlan(dp_replicate=2, tp=2)
    mode = DataParallelMode.for_plan(plan)
    with pytest.raises(ValueError, match="audit=True but .*no local gradient.*dp_shard"):
        resolve_audit(AuditOptions(mode=True), plan, mode)
    with caplog.at_level("WARNING", logger="mixle_parallel.executors.torch.sdc_audit"):
        assert resolve_audit(AuditOptions(), plan, mode) is None  # the default: off, not a vacuous pass
    assert any("SDC audit off for this run" in r.getMessage() and "dp_shard" in r.getMessage()
               for r in caplog.records)  # and it says so
    fsdp_tp = ParallelPlan(dp_shard=2, tp=2)
    assert resolve_audit(AuditOptions(mode=True), fsdp_tp, DataParallelMode.for_plan(fsdp_tp)) is not None


def test_skip_reasons_name_what_prevents_a_one_rank_recomputation(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ref.tp_reference_skip_reason(make_model()) is None
    dropout = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    assert "active dropout (1)" in (ref.tp_reference_skip_reason(dropout) or "")
    assert ref.tp_reference_skip_reason(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0))) is None
    with torch.device("meta"):
        meta = nn.Linear(4, 4)
    assert "meta device" in (ref.tp_reference_skip_reason(meta) or "")
    monkeypatch.setattr(ref, "MAX_REFERENCE_BYTES", 100)
    assert "one-rank limit" in (ref.tp_reference_skip_reason(nn.Linear(8, 8)) or "")


def test_no_template_is_kept_when_the_reference_will_be_skipped() -> None:
    plan, device = ParallelPlan(tp=2), torch.device("cpu")
    mode = DataParallelMode.for_plan(plan)
    template = sharded_reference_template(make_model(), plan, mode, AuditOptions(), device)
    assert template is not None and all(p.numel() == 0 for p in template.parameters())  # structure, no weights
    dropout = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    assert sharded_reference_template(dropout, plan, mode, AuditOptions(), device) is None
    assert sharded_reference_template(make_model(), plan, mode, None, device) is None  # audit off


def test_tolerance_is_the_harness_default_or_audit_bound() -> None:
    assert ref.reference_tolerance(0.0, "fp32") == default_tolerance("fp32")
    assert ref.reference_tolerance(0.0, "bf16") == default_tolerance("bf16")
    bound = ref.reference_tolerance(1e-3, "fp32")
    assert (bound.atol, bound.rtol) == (1e-3, 0.0) and "audit_bound" in bound.source
    with pytest.raises(ValueError, match="fp8"):
        ref.reference_tolerance(0.0, "fp8")


def _record(replay: str, rank: int, matched: bool) -> SDCAuditRecord:
    return SDCAuditRecord(family="training", step=0, rank=rank, unit="local_gradient", replay=replay,
                          expected_digest=SHA, observed_digest=SHA, matched=matched,
                          action="none" if matched else "raise", attributed_rank=None if matched else rank,
                          bound=1e-5)


def test_a_reference_mismatch_is_a_backend_defect_when_the_same_rank_replay_reproduces_it() -> None:
    records = [_record("reference", 0, False), _record("reference", 1, False), _record("reference", 2, False),
               _record("same_rank", 0, True), _record("same_rank", 1, False)]
    causes = {(r.replay, r.rank): r.cause for r in ref.attribute_causes(records)}
    assert causes[("reference", 0)] == "backend_defect"  # the executor's own replay agreed with the wrong result
    assert causes[("reference", 1)] == "device"  # its replay did not reproduce it
    assert causes[("reference", 2)] == ""  # no same-rank replay to tell
    assert causes[("same_rank", 1)] == ""
