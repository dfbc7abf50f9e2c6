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




from mixle_parallel.contracts import (  # noqa: E402
    BackendCapabilities,
    CollectiveKind,
    DistributedUpdate,
    NumericsEvidence,
    PayloadKind,
    StateLayout,
    Tolerance,
)


class StubExecutor:
    """Capabilities, version and declared updates only (for admission tests; nothing runs)."""

    def __init__(self, name: str = "stub", version: str = "1.0", axes=("dp_shard", "tp")) -> None:
        self._caps = BackendCapabilities(name=name, axes=frozenset(axes), precisions=frozenset({"fp32", "bf16"}))
        self._version = version

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._caps

    @property
    def version(self) -> str:
        return self._version

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        return (DistributedUpdate("grad:dp_shard", PayloadKind.GRADIENT, CollectiveKind.REDUCE_SCATTER,
                                  ("dp_shard",), StateLayout.SHARDED, False),)


def make_evidence(plan: ParallelPlan, *, executor: str = "stub", node_id: str = "grad:dp_shard",
                  within: bool = True, deterministic: bool = True, collectives: bool = True,
                  precision: str = "fp32") -> NumericsEvidence:
    """A NumericsEvidence record with the given verdicts."""
    return NumericsEvidence(node_id=node_id, payload="gradient", executor=executor, plan=plan, precision=precision,
                            trials=2, sample_count=100, maximum_absolute_error=1e-7 if within else 1.0,
                            maximum_relative_error=1e-6 if within else 0.5, deterministic=deterministic,
                            within_tolerance=within, tolerance=Tolerance(atol=1e-5, rtol=1.3e-6, source="test"),
                            collectives_match=collectives)


def admits(envelope, executor, plan: ParallelPlan, precision: str) -> str:
    """The certificate id when the gate admits ``executor`` on ``plan`` (as a world of >= 2) under ``envelope``."""
    from mixle_parallel.verification.admission import require_admission

    decision = require_admission(executor, plan, precision, certificate=envelope, world_size=max(2, plan.world_size))
    assert decision.certified
    return decision.certificate_id
