"""A training run's ledger, written by one owner: rank 0.

``prepare(ledger=...)`` takes a path or a ``verification.Ledger``. Rank 0 owns a training run's
ledger: a path may be passed on every rank (rank 0 opens it before any process group exists, the
others ignore it), a ``Ledger`` object only on rank 0 (another rank gets ``ValueError`` saying so;
two writers would interleave their chains into a ledger the audit calls corrupted). What rank 0
writes covers the run: ``run_start``, every receipt of rank 0 (its counts are global), every
rank's audit records (the audit ends with all of them on every rank), checkpoint events and
``run_end``. The session, its audit and its health monitor only report; ``RunLedger`` writes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ...contracts import AdmissionMode, ParallelPlan, SDCAuditRecord, StepReceipt
from ...verification.ledger import Ledger

__all__ = ["RunLedger", "current_rank", "ledger_on_this_rank"]


def current_rank() -> int:
    """This process's rank: the process group's, else torchrun's ``RANK`` (before the group exists), else 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    text = os.environ.get("RANK", "0")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"RANK={text!r} is not an integer; launch with torchrun") from None


def ledger_on_this_rank(ledger: Any, rank: int) -> Ledger | None:
    """The ledger this rank writes: a path opened on rank 0 (None elsewhere); a ``Ledger`` only on rank 0."""
    if ledger is None:
        return None
    if isinstance(ledger, Ledger):
        if rank != 0:
            raise ValueError(
                f"ledger: rank 0 owns a training run's ledger, and rank {rank} was given a Ledger; pass "
                "ledger=Ledger(path) on rank 0 only (None elsewhere), or pass the path on every rank: rank 0 "
                "opens it and the others leave it alone")
        return ledger
    return Ledger(ledger) if rank == 0 else None


class RunLedger:
    """The session's one ledger writer (a no-op without a ledger): run_start, receipts, audit records,
    checkpoint events, run_end."""

    def __init__(self, ledger: Ledger | None, *, rank: int) -> None:
        self.ledger, self.rank = ledger, rank

    def start(self, *, executor: str, plan: ParallelPlan, precision: str, decision: Any,
              audit: dict[str, Any]) -> None:
        """run_start: plan, certificate link, executor, precision, admission mode, rank and audit settings."""
        if self.ledger is None:
            return
        unverified = AdmissionMode.UNVERIFIED.value  # a session built by hand, without prepare()'s gate
        link = getattr(decision, "envelope", None) or getattr(decision, "ledger_link", unverified)
        self.ledger.run_start(plan=plan, certificate=link, executor=executor, extra={
            "precision": precision, "admission": getattr(decision, "mode", unverified), "rank": self.rank,
            "audit": audit})

    def receipt(self, receipt: StepReceipt) -> None:
        """One step's receipt."""
        if self.ledger is not None:
            self.ledger.receipt(receipt, rank=self.rank)

    def audit(self, records: Sequence[SDCAuditRecord]) -> None:
        """An audited step's records, in the order the audit found them (before the step's receipt)."""
        if self.ledger is not None:
            for record in records:
                self.ledger.audit(record)

    def checkpoint(self, *, step: int, path: str, extra: dict[str, Any]) -> None:
        """A checkpoint saved or loaded."""
        if self.ledger is not None:
            self.ledger.checkpoint(step=step, path=path, extra=extra)

    def provenance(self, generation_dir: Path, *, data: Any) -> Path | None:
        """Rank 0: the signed provenance statement of a published generation, bound to this ledger's head."""
        if self.rank != 0:
            return None
        if self.ledger is None:
            raise ValueError("provenance=True binds the run's ledger: pass ledger=PATH to prepare() (rank 0 "
                             "writes it), or save without provenance")
        from .checkpoint_provenance import write_checkpoint_provenance

        return write_checkpoint_provenance(generation_dir, ledger=self.ledger.path, data=data)

    def end(self, *, steps: int, extra: dict[str, Any]) -> None:
        """run_end(status="ok") at close."""
        if self.ledger is not None:
            self.ledger.run_end(status="ok", steps=steps, extra=extra)

    def failed(self, anomaly: Any) -> None:
        """run_end(status="failed") for a fatal health anomaly (the heartbeat calls it before the rank exits)."""
        if self.ledger is not None:
            self.ledger.run_end(status="failed", steps=anomaly.detected_at_step, extra={"health": anomaly.as_dict()})
