"""mixle's ``sdc_audit`` names over our audit: ``AuditedMPEncodedData``, ``SDCAuditReceipt``, ``inject_bit_flip``.

``AuditedMPEncodedData`` is the ``mp`` handle with the SDC audit always on (``executors.estimation.
sdc_audit``: audited chunks recomputed on a peer, a third worker witnesses a mismatch, the faulty
worker is quarantined and its chunks recomputed) and every pass folded by
:func:`~.finite_guard.guarded_fold_pass`, which names the chunk and worker of a NaN/Inf; a non-finite
run of chunks folded on a worker is recomputed there chunk by chunk to name the very chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ...contracts import AuditPolicy, SDCAuditRecord
from ...verification.sdc.inject import BitFlip, FaultInjector
from .chunks import WorkerTask, chunk_estep
from .engines.mp import MPChunkRunner
from .finite_guard import (
    NonFiniteStatisticError,
    check_chunk_result,
    guarded_fold_pass,
)
from .handle import ChunkedEncodedData

__all__ = ["AuditedMPEncodedData", "SDCAuditReceipt", "audit_receipts", "inject_bit_flip"]


def inject_bit_flip(payload: bytes, bit_offset: int | None = None) -> bytes:
    """``payload`` with exactly one bit flipped (default: the middle bit; offsets wrap around)."""
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"inject_bit_flip takes bytes, got {type(payload).__name__}; for statistics in a "
                        "running fit use BitFlip('statistic', 'chunk:<c>', rank=, step=) with arm_corruption")
    if not payload:
        raise ValueError("cannot flip a bit of an empty payload")
    bits = len(payload) * 8
    offset = bits // 2 if bit_offset is None else int(bit_offset) % bits
    out = bytearray(payload)
    out[offset // 8] ^= 1 << (offset % 8)
    return bytes(out)


@attrs.frozen(kw_only=True)
class SDCAuditReceipt:
    """One detected mismatch in mixle's terms: round, shard (chunk), primary/audit/witness workers,
    digests, suspects and what was done; ``records`` are the ``SDCAuditRecord``s it was read from."""

    round: int
    shard_id: int
    primary_worker: int
    audit_worker: int | None
    primary_sha256: str
    audit_sha256: str
    witness_worker: int | None = None
    suspected_workers: tuple[int, ...] = ()
    quarantine_status: str = "not_requested"
    comparison_mode: str = "bitwise"
    max_abs_error: float = 0.0
    records: tuple[SDCAuditRecord, ...] = ()

    def summary(self) -> str:
        """One line for logs."""
        return (f"SDC audit mismatch: round={self.round} shard={self.shard_id} primary={self.primary_worker} "
                f"audit={self.audit_worker} witness={self.witness_worker} primary={self.primary_sha256[:19]} "
                f"audit={self.audit_sha256[:19]} suspects={list(self.suspected_workers)} "
                f"status={self.quarantine_status} comparison={self.comparison_mode}")


_STATUS: dict[str, str] = {AuditPolicy.QUARANTINE: "quarantined", AuditPolicy.RAISE: "raised",
                           AuditPolicy.WARN: "warned", AuditPolicy.SKIP_STEP: "skipped"}
"""mixle's ``quarantine_status`` of a mismatch, by the policy that handled it (a record's text finds its key)."""


def audit_receipts(records: Iterable[SDCAuditRecord]) -> list[SDCAuditReceipt]:
    """One :class:`SDCAuditReceipt` per mismatched (step, chunk) among EM ``SDCAuditRecord``s."""
    grouped: dict[tuple[int, str], list[SDCAuditRecord]] = {}
    for r in records:
        grouped.setdefault((r.step, r.unit), []).append(r)
    out = []
    for (step, unit), recs in grouped.items():
        bad = [r for r in recs if not r.matched]
        if not bad:
            continue
        first = next((r for r in recs if r.replay in ("peer", "same_rank")), recs[0])
        witness = next((r for r in recs if r.replay == "witness"), None)
        suspects = tuple(sorted({r.attributed_rank for r in bad if r.attributed_rank is not None}))
        out.append(SDCAuditReceipt(
            round=step, shard_id=int(unit.split(":", 1)[1]) if unit.startswith("chunk:") else -1,
            primary_worker=first.rank, audit_worker=first.auditor_rank, primary_sha256=first.observed_digest,
            audit_sha256=first.expected_digest, witness_worker=witness.auditor_rank if witness else None,
            suspected_workers=suspects, quarantine_status=_STATUS.get(bad[0].action, bad[0].action),
            max_abs_error=max(r.maximum_absolute_difference for r in bad), records=tuple(recs)))
    return out


class AuditedMPEncodedData(ChunkedEncodedData):
    """The ``mp`` handle with the SDC audit always on and every combine NaN/Inf-guarded (module doc).

    mixle's arguments are taken; ``audit_rtol``/``audit_atol`` are recorded only, since our audit
    compares statistics bitwise (a chunk's statistics have the same bits on every worker).
    ``max_retries`` is recorded only: the mp runner recomputes a lost worker's chunks on the
    survivors until none is left.
    """

    def __init__(self, data: Sequence[Any], estimator: Any = None, encoder: Any = None,
                 num_workers: int | None = None, sub_chunks: int = 1, max_retries: int = 2,
                 audit_rate: float = 0.1, audit_rtol: float = 1e-12, audit_atol: float = 1e-12,
                 rng: Any = None, worker_timeout_s: float = 30.0, *, num_chunks: int | None = None,
                 audit_policy: AuditPolicy | str = AuditPolicy.QUARANTINE, ledger: Any = None,
                 fault_injector: Any = None) -> None:
        for name, value in (("audit_rtol", audit_rtol), ("audit_atol", audit_atol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if isinstance(sub_chunks, bool) or not isinstance(sub_chunks, int) or sub_chunks < 1:
            raise ValueError(f"sub_chunks must be an int >= 1, got {sub_chunks!r}")
        self.audit_rtol, self.audit_atol, self.max_retries = float(audit_rtol), float(audit_atol), int(max_retries)
        self._last_model: Any = None
        runner = MPChunkRunner(num_workers, timeout=worker_timeout_s)
        workers = runner.num_workers
        chunks = num_chunks if num_chunks is not None else max(1, workers * int(sub_chunks))
        try:
            super().__init__(runner, data, estimator=estimator, encoder=encoder, num_chunks=chunks)
            self.attach_verification(admission=None, audit=True, audit_rate=audit_rate, audit_policy=audit_policy,
                                     audit_seed=_seed(rng), ledger=ledger, fault_injector=fault_injector)
        except BaseException:
            runner.close()
            raise

    # -- mixle's instrumentation ----------------------------------------------------------------
    @property
    def audit_receipts(self) -> list[SDCAuditReceipt]:
        """One receipt per detected mismatch so far."""
        return audit_receipts(self.audit_records)

    @property
    def last_round_audit_mismatches(self) -> list[SDCAuditReceipt]:
        """The receipts of the last E-step's mismatches."""
        return audit_receipts(self.last_audit_records)

    @property
    def last_round_audited_shards(self) -> set[int]:
        """Chunks audited in the last E-step."""
        return {o.chunk for o in self.last_audits}

    def arm_corruption(self, flips: BitFlip | Iterable[BitFlip] | FaultInjector | None) -> None:
        """Plan bit flips of chunk statistics inside the workers (``BitFlip('statistic', 'chunk:<c>',
        rank=<worker>, step=<iteration>, index, bit)``); ``None`` clears the plan."""
        if flips is None or isinstance(flips, FaultInjector):
            injector = flips
        else:
            injector = FaultInjector([flips] if isinstance(flips, BitFlip) else list(flips))
        self._audit.injector = injector

    def pysp_stream_accumulate(self, estimator: Any, model: Any) -> tuple[float, Any]:
        """One audited, guarded pass: ``(nobs, statistics)``."""
        result = self.estep(estimator, model)
        return result.nobs, result.stats

    # -- the guarded fold -----------------------------------------------------------------------
    def _fold_entries(self, estimator: Any, entries: list[Any]) -> Any:
        sources = self._metered.chunk_workers
        try:
            return guarded_fold_pass(estimator, entries, where="AuditedMPEncodedData", workers=sources)
        except NonFiniteStatisticError as exc:
            a, b = exc.chunks
            if a == b or len(exc.workers) != 1 or exc.stage != "entry":
                raise
            raise self._pinpoint(estimator, a, b, exc.workers[0], exc) from exc

    def _pinpoint(self, estimator: Any, a: int, b: int, worker: int, exc: NonFiniteStatisticError) -> Exception:
        """Recompute chunks ``a..b`` one by one on ``worker`` to name the chunk that is non-finite."""
        model = self._last_model
        task = WorkerTask(chunk_estep, (estimator, model), tuple(range(a, b + 1)))
        out = self._metered.run_on_workers({worker: task})
        for c, result in zip(range(a, b + 1), out[worker]):
            try:
                check_chunk_result(result, c, (worker,), where="AuditedMPEncodedData")
            except NonFiniteStatisticError as found:
                return found
        return NonFiniteStatisticError(f"{exc}; recomputed chunk by chunk on worker {worker} they are finite: a "
                                       f"transient fault on that worker", chunks=exc.chunks, workers=exc.workers,
                                       element=exc.element, stage="transient")

    def estep(self, estimator: Any, model: Any) -> Any:
        """The audited, guarded E-step (see ``ChunkedEncodedData.estep``)."""
        self._last_model = model
        return super().estep(estimator, model)


def _seed(rng: Any) -> int:
    if rng is None:
        return 0
    if isinstance(rng, int) and not isinstance(rng, bool):
        return rng
    return int(rng.randint(2**31 - 1)) if hasattr(rng, "randint") else int(rng.integers(2**31 - 1))
