"""A fit's audited passes judged in batches: one read of the references for several passes (DESIGN §9).

Why: where the rows are read again from their source, each pass's references cost an engine job (a Spark job costs
about 0.1 s whatever it reads, as much as the pass itself). Within a fit the next pass needs only this pass's sum,
so the fit goes on with the committed sums and judges the passes together, their samples read in one request: at
the latest when it stops, and before a batch spans a cycle of the draw (``ceil(1/rate)`` passes) or its audited
rows pass :data:`DEFERRED_ROWS`. What :mod:`estep` promises holds for every pass: its sample is drawn after its
commitments, from fresh entropy; its receipt is written once it is judged, in order; the fit returns no model of a
pass not judged. Judging one pass is :func:`estep.judge_pass`, as in a pass judged at once.

A pass whose judging changes its sum (a quarantined worker's chunks recomputed) makes the fit take up from it:
the passes run after it are dropped unjudged and the draw's cycle set back, so the fit ends on the bits, receipts
and draws of a fit judged pass by pass. Only a driver's passes against its own reference defer (not SPMD ranks,
mixle's named draw, a pass a planned fault strikes or with a worker kept idle, or own results too large to ship).
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ....contracts.estimation import statistic_digest
from .chunks import EStepResult, chunk_estep
from .estep import (
    CommittedPass,
    DriverReference,
    commit_pass,
    folded_result,
    judge_pass,
    record_receipt,
    shipped_own_results,
    write_findings,
)
from .runner_protocols import RunLedger

if TYPE_CHECKING:
    from ..audit.sdc_audit import EMAudit

__all__ = ["DEFERRED_ROWS", "DeferredJudging", "DeferredPasses", "JudgedBatch", "JudgedPass", "PendingPass"]

DEFERRED_ROWS = 1 << 20
"""The most audited rows a batch holds before it is judged (they are read into this process together)."""


@attrs.define(eq=False)
class PendingPass:
    """A pass the fit ran on, committed and drawn, not yet judged: what its receipt and a step back need."""

    committed: CommittedPass
    result: EStepResult
    fields: dict[str, Any]
    """The receipt's fields measured when the pass ran (workers, transport, observability, draw)."""
    draw_state: tuple[int, int, frozenset[int]]
    """The draw's cycle before this pass drew (``SystematicDraw.state``)."""
    draws: int
    """How many draws the audit held before this pass's."""
    rows: int


@attrs.frozen
class JudgedPass:
    """One judged pass: its iteration, the result that stands and the audit's records of it."""

    iteration: int
    result: EStepResult
    records: tuple[Any, ...]
    outcomes: tuple[Any, ...]
    fields: dict[str, Any]


@attrs.frozen
class JudgedBatch:
    """The passes judged, in order. ``resumed``: the last one's judged sum is not the one the fit ran on (its
    result is the mended one), and the passes after it were dropped."""

    passes: tuple[JudgedPass, ...]
    resumed: bool = False


def _same(a: EStepResult, b: EStepResult) -> bool:
    return (a.nobs, a.log_likelihood, statistic_digest(a.stats)) == (b.nobs, b.log_likelihood,
                                                                      statistic_digest(b.stats))


def defers(audit: EMAudit | None) -> bool:
    """Whether ``audit``'s passes can ever wait to be judged: one driver's own reference, no named draw."""
    return (audit is not None and isinstance(audit.reference, DriverReference) and audit.gather is None
            and audit.named_draw is None)


class DeferredJudging:
    """The passes of one fit waiting to be judged, and when they must be (module doc)."""

    def __init__(self, audit: EMAudit, bounds: Sequence[tuple[int, int]]) -> None:
        self.audit = audit
        self.bounds = tuple(bounds)
        self.pending: list[PendingPass] = []
        self.max_passes = max(1, audit.sampler.length)

    def may_defer(self, estimator: Any, iteration: int) -> bool:
        """Whether the pass at ``iteration`` may wait to be judged (module doc: a driver's reference, no planned
        fault, every worker in use, own results shipped with the pass)."""
        audit = self.audit
        return (defers(audit) and not audit.injection_pending(iteration) and not audit.excluded
                and audit.ships_own_results(estimator, len(self.bounds)))

    def due(self, iteration: int) -> bool:
        """Whether the batch must be judged before the pass at ``iteration`` runs."""
        if not self.pending:
            return False
        rows = sum(p.rows for p in self.pending)
        estimator = self.pending[-1].committed.payload[0]
        return len(self.pending) >= self.max_passes or rows >= DEFERRED_ROWS or not self.may_defer(estimator,
                                                                                                  iteration)

    def hold(self, committed: CommittedPass, result: EStepResult, fields: dict[str, Any],
             draw_state: tuple[int, int, frozenset[int]], draws: int) -> None:
        """Keep a pass the fit goes on from, to be judged with the batch."""
        rows = sum(self.bounds[c][1] - self.bounds[c][0] for c in committed.audited)
        self.pending.append(PendingPass(committed, result, fields, draw_state, draws, rows))

    def judge(self, encoder: Any, fold: Callable[[Any, list[Any]], Any],
              on_judged: Callable[[JudgedPass], None]) -> JudgedBatch:
        """Judge the batch in order, its samples read in one request; ``on_judged`` gets each judged pass (the
        handle writes its findings and receipt). Stops at the first pass whose sum judging changed, dropping the
        passes after it and setting the draw back to before them."""
        audit, pending = self.audit, self.pending
        self.pending = []
        reference = audit.reference
        assert isinstance(reference, DriverReference)  # only such passes were held
        rebuilt = reference.encoded(sorted({c for p in pending for c in p.committed.audited}), encoder)
        done: list[JudgedPass] = []
        for k, held in enumerate(pending):
            committed = held.committed
            outcomes: tuple[Any, ...] = ()
            if committed.audited:
                refs = {c: chunk_estep(rebuilt[c], committed.payload) for c in committed.audited}
                revealed = shipped_own_results(committed.entries, committed.audited) or {}
                try:
                    outcomes = judge_pass(audit, committed, refs, revealed)
                except BaseException:
                    self.pending = pending[k + 1:]  # not judged: ``drop`` notes them in the ledger
                    raise
            result = held.result
            if any(not r.matched for o in outcomes for r in o.records):  # mended entries may sum to another total
                again = folded_result(committed.payload[0], committed.entries, fold)
                result = held.result if _same(again, held.result) else again
            judged = JudgedPass(committed.iteration, result, tuple(r for o in outcomes for r in o.records),
                                outcomes, held.fields)
            done.append(judged)
            on_judged(judged)
            if result is not held.result:
                if k + 1 < len(pending):
                    after = pending[k + 1]
                    audit.sampler.restore(after.draw_state)
                    del audit.draws[after.draws:]
                return JudgedBatch(tuple(done), resumed=True)
        return JudgedBatch(tuple(done))

    def drop(self) -> int:
        """Forget the passes not judged (a fit that failed); how many there were."""
        count, self.pending = len(self.pending), []
        return count


class _DeferringHost(Protocol):
    """What the deferred passes use of the handle they are part of."""

    ledger: RunLedger | None
    admission: Any
    iteration: int
    last_audits: tuple[Any, ...]
    last_receipt: Any
    _audit: EMAudit | None
    _deferred: DeferredJudging | None
    _encoder: Any
    _fit_first: bool

    @property
    def quarantined(self) -> frozenset[int]: ...

    @property
    def bounds(self) -> Sequence[tuple[int, int]]: ...

    @property
    def rank_records(self) -> MutableSequence[Any]: ...

    @property
    def num_chunks(self) -> int: ...

    def _fold_entries(self, estimator: Any, entries: list[Any]) -> Any: ...


class DeferredPasses:
    """A handle's side of judging a fit's passes in batches (module doc): the fit turns it on, asks when a batch
    is due and has it judged; ``estep`` holds the passes that may wait."""

    _deferred: DeferredJudging | None = None

    def defer_judging(self: _DeferringHost, on: bool) -> bool:
        """Let the next E-steps wait to be judged in batches (``on``; True when this handle can); off drops the
        passes not judged (a fit that failed), with a ledger note."""
        if on:
            audit = self._audit
            self._deferred = DeferredJudging(audit, self.bounds) if audit is not None and defers(audit) else None
            return self._deferred is not None
        dropped = self._deferred.drop() if self._deferred is not None else 0
        self._deferred = None
        if dropped and self.ledger is not None:
            self.ledger.note(f"{dropped} E-step(s) of the fit were not judged: the fit stopped before their batch "
                             "was", dropped=dropped, iteration=self.iteration)
        return False

    @property
    def passes_held(self: _DeferringHost) -> int:
        """How many passes wait to be judged."""
        return 0 if self._deferred is None else len(self._deferred.pending)

    def judging_due(self: _DeferringHost) -> bool:
        """Whether the passes held must be judged before the next E-step (``DeferredJudging.due``)."""
        return self._deferred is not None and self._deferred.due(self.iteration)

    def judge_deferred(self: _DeferringHost) -> JudgedBatch:
        """Judge the passes held, in order, their findings and receipts written as each is judged; after a pass whose
        judged sum changed (``JudgedBatch.resumed``) the next E-step is the one after it."""
        if self._deferred is None or self._audit is None:
            return JudgedBatch(())
        audit, ledger = self._audit, self.ledger

        def judged(one: JudgedPass) -> None:
            write_findings(ledger, audit.take_events())
            self.last_audits = one.outcomes
            self.last_receipt = record_receipt(ledger, one.iteration, one.result, admission=self.admission,
                                               outcomes=one.outcomes, quarantined=sorted(self.quarantined),
                                               **one.fields)

        try:
            batch = self._deferred.judge(self._encoder, self._fold_entries, judged)
        finally:
            write_findings(ledger, audit.take_events())
        if batch.resumed:
            last = batch.passes[-1].iteration
            self.iteration = last + 1
            self.rank_records[:] = [r for r in self.rank_records if r.round <= last]
        return batch

    def _commit_held(self: _DeferringHost, estimator: Any, model: Any,
                     iteration: int) -> tuple[CommittedPass, tuple[int, int, frozenset[int]], int]:
        """A pass that waits to be judged: committed and drawn now, with the draw's state before it."""
        assert self._audit is not None
        before, draws = self._audit.sampler.state(), len(self._audit.draws)
        try:
            held = commit_pass(self._audit, estimator, model, iteration=iteration, num_chunks=self.num_chunks,
                               first_of_fit=self._fit_first)
        finally:
            write_findings(self.ledger, self._audit.take_events())
        return held, before, draws
