"""Helpers for the verification tests: small contracts to put in ledgers and certificates."""

from __future__ import annotations

from mixle_parallel.contracts import ParallelPlan, SDCAuditRecord, StepReceipt


def make_receipt(step: int, *, skipped: bool = False, extra: dict | None = None) -> StepReceipt:
    """A plausible receipt for ``step``."""
    return StepReceipt(step=step, loss=1.0 / (step + 1), local_examples=8, local_tokens=64, microbatches=1,
                       accumulation_steps=1, data_parallel_size=2, optimizer="sgd", precision="fp32",
                       skipped=skipped, extra=extra or {})


def make_audit(step: int, rank: int = 0) -> SDCAuditRecord:
    """A clean audit record."""
    return SDCAuditRecord(family="training", step=step, rank=rank, unit=f"step:{step}", replay="same_rank",
                          expected_digest="sha256:aa", observed_digest="sha256:aa", matched=True)


