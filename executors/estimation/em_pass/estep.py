"""One EM pass read top to bottom (DESIGN §9): audited against the independent reference, then findings, fold, receipt.

1. Hand the runner its tasks: every chunk on its worker, the same tasks on every pass (no chunk named);
   each combine group folds on its worker and commits to a digest per chunk (``GroupFold(commit=True)``).
2. Check that every group came back with its sum and a well-formed commitment per chunk
   (``check_commitments``: a ``BackendDefectError`` naming the group).
3. Draw the sample, only now, from fresh entropy (``EMAudit.draw_sample``, systematic: ``audit_draw``).
4. Fetch the audited chunks' references (rows in the driver, or read again from their source, in one
   request), outside the backend; replay on its worker what differs.
5. Judge (``audit_judge``: pure), and apply the verdict (records, quarantine, raise per policy).
6. Mend: a quarantined worker's chunks are recomputed on the others and re-checked against the reference.
7. Open the folded groups holding an audited chunk (their workers reveal the chunks' own results, or the pass
   brought them already: ``audit.reveal_mode``) and judge each sum against its commitments; mend again.

Around every pass, audited or not (the handle calls these, then keeps what they return): the audit's findings
go to the ledger even when the pass raises (:func:`audited_entries`, :func:`write_findings`), the entries are
folded in the fixed order and the M-step taken (:func:`folded_result`), and the pass's receipt is made and
written (:func:`record_receipt`). Nothing here reaches back into the handle: it is given plain values, the
audit's state (``EMAudit``) and the ledger.

The pass is two halves: :func:`commit_pass` (steps 1-3) and :func:`judge_pass` (steps 5-7, given the references).
``estep`` runs them back to back; a fit may hold several committed passes and judge them together, their samples
read in one request (``deferred_judging``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ....contracts import StepReceipt
from ....verification.sdc.em import ChunkAudit, within_tolerance
from ....verification.sdc.schedule import SDCDetectedError
from ..audit.audit_findings import AuditEvent, AuditNote
from ..audit.audit_judge import ChunkEvidence, FoldEvidence, Verdict, judge_chunks, judge_folds, replays_needed
from ..audit.audit_receipt import em_receipt
from ..audit.commitments import check_commitments, unreadable_own_result
from ..audit.fold_binding import fold_digest, opened_groups, refold_on, reveal_chunks
from .chunks import ChunkResult, EncodedChunk, EStepResult, chunk_estep
from .combine_order import UnreadableOwnResult, commit_digest, committed_result, fold_group, opened, own_result
from .runner_protocols import RunLedger

if TYPE_CHECKING:
    from ..audit.sdc_audit import EMAudit
    from ..sources import ChunkPlace, OpenedSource

__all__ = ["CommittedPass", "DriverReference", "References", "audited_entries", "commit_pass", "folded_result",
           "judge_against_reference", "judge_pass", "open_folded_groups", "record_receipt", "reference_pass",
           "rows_reference", "shipped_own_results", "source_reference", "write_findings"]


class References(Protocol):
    """The audited chunks' E-steps computed outside the backend's runner, E-step and transport, by chunk id."""

    def __call__(self, chunks: Sequence[int], encoder: Any, estimator: Any,
                 model: Any) -> dict[int, ChunkResult]: ...


@attrs.frozen(eq=False)
class CommittedPass:
    """One audited pass up to its draw (steps 1-3): the entries as they came back, committed per chunk, and what
    judging it needs later (the sample, the owners, the payload it ran under, its token and planned faults)."""

    entries: list[Any]
    struck: set[tuple[int, int]]
    owners: list[int]
    audited: tuple[int, ...]
    payload: tuple[Any, Any]
    iteration: int
    token: str


def reference_pass(audit: EMAudit, estimator: Any, model: Any, *, iteration: int, num_chunks: int,
                   encoder: Any, first_of_fit: bool) -> tuple[list[Any], tuple[ChunkAudit, ...]]:
    """The entries of one pass audited against the reference (chunk order, for ``fold_pass``) and the
    outcomes; the module doc lists the steps."""
    # 1-3. the tasks, every group's commitments, the sample drawn only now
    committed = commit_pass(audit, estimator, model, iteration=iteration, num_chunks=num_chunks,
                            first_of_fit=first_of_fit)
    if not committed.audited:
        return committed.entries, ()
    # 4. the references, computed here while the workers reveal the opened groups' chunks (both after the draw)
    refs, revealed = _references_and_reveals(audit, committed.entries, committed.audited, committed.owners,
                                             committed.payload, encoder, committed.token)
    # 5-7. judged, mended, the opened groups judged
    return committed.entries, judge_pass(audit, committed, refs, revealed)


def commit_pass(audit: EMAudit, estimator: Any, model: Any, *, iteration: int, num_chunks: int,
                first_of_fit: bool) -> CommittedPass:
    """Steps 1-3: the pass's tasks handed to the runner, every group's sum and commitments checked, then the sample
    drawn from fresh entropy."""
    payload = (estimator, model)
    token = audit.pass_token(iteration)
    # 1. the tasks: the same on every pass
    entries, struck = audit.committed_pass(payload, iteration, num_chunks, token)
    # 2. every group's sum and a commitment per chunk
    owners = audit.chunk_owners(num_chunks)
    check_commitments(entries, num_chunks, backend=audit.runner.name, iteration=iteration, owners=owners)
    # 3. the sample, drawn only now
    audited = audit.draw_sample(num_chunks, owners, first_of_fit=first_of_fit)
    return CommittedPass(entries, struck, owners, tuple(audited), payload, iteration, token)


def judge_pass(audit: EMAudit, committed: CommittedPass, refs: dict[int, Any],
               revealed: dict[int, Any]) -> tuple[ChunkAudit, ...]:
    """Steps 5-7 on a committed pass given its references: a replay on its worker of what differs, the judge's
    verdict applied and mending, then the folded groups holding an audited chunk opened and judged. Mending
    rewrites ``committed.entries`` in place."""
    entries, audited, owners = committed.entries, committed.audited, committed.owners
    try:
        outcomes = judge_against_reference(audit, entries, refs, audited, owners, committed.payload,
                                           committed.iteration, committed.struck if audit.placement else None)
        folds = open_folded_groups(audit, entries, committed.payload, committed.iteration, audited, owners,
                                   committed.token, revealed)
    except UnreadableOwnResult as exc:  # a sealed own result that is no result: the backend's defect
        raise unreadable_own_result(exc, len(entries), backend=audit.runner.name, iteration=committed.iteration,
                                    owners=owners) from None
    return outcomes + folds


def shipped_own_results(entries: list[Any], chunks: Sequence[int]) -> dict[int, Any] | None:
    """The own results of the groups opened for ``chunks`` where the pass brought them (``reveal_mode``; sealed as
    they came), else None (a reveal round must ask the workers)."""
    ids = [c for a, b in opened_groups(entries, chunks) for c in range(a, b)]
    own = {c: own_result(entries, c) for c in ids}
    return own if all(v is not None for v in own.values()) else None


def _references_and_reveals(audit: EMAudit, entries: list[Any], audited: Sequence[int], owners: Sequence[int],
                            payload: tuple[Any, Any], encoder: Any,
                            token: str) -> tuple[dict[int, Any], dict[int, Any]]:
    """The audited chunks' references and the opened groups' revealed chunks. In one driver the references are
    computed on a thread while the workers reveal (the driver mostly waits on them); on SPMD ranks, whose
    gathers and reveals are collectives in a fixed order, one after the other."""
    own = shipped_own_results(entries, audited)
    if own is not None:  # the pass brought the own results (``reveal_mode``): no round
        return audit.references(audited, encoder, *payload), own
    ids = [c for a, b in opened_groups(entries, audited) for c in range(a, b)]
    if audit.gather is not None:
        return audit.references(audited, encoder, *payload), {}
    found: dict[str, Any] = {}

    def work() -> None:
        try:
            found["refs"] = audit.references(audited, encoder, *payload)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the pass
            found["error"] = exc

    thread = threading.Thread(target=work, name="em-audit-reference", daemon=True)
    thread.start()
    try:
        revealed = reveal_chunks(audit.runner, audit.placement, ids, owners, payload, token)
    finally:
        thread.join()
    if "error" in found:
        raise found["error"]
    return found["refs"], revealed


def judge_against_reference(audit: EMAudit, entries: list[Any], refs: dict[int, Any], audited: Sequence[int],
                            owners: list[int], payload: tuple[Any, Any], iteration: int,
                            struck: set[tuple[int, int]] | None) -> tuple[ChunkAudit, ...]:
    """Each audited chunk's committed result against its reference, what differs replayed on its worker through
    the backend, judged (``audit_judge.judge_chunks``), the verdict applied; a quarantined worker's chunks are
    recomputed on the others and must then agree with their references."""
    evidence = [ChunkEvidence(c, owners[c], *committed_result(entries, c), refs[c],
                              injected=struck is not None and any(k[1] == c for k in struck)) for c in audited]
    replays = {c: audit.replay(owners[c], c, payload) for c in replays_needed(evidence, commit_digest)}
    placed = struck is not None  # a runner that places work: a device fault may quarantine its worker
    verdict = judge_chunks(evidence, replays, iteration=iteration, policy=audit.auditor.policy,
                           tolerance=audit.tolerance, digest=commit_digest,
                           healthy=audit.healthy() if placed else (), may_quarantine=placed)
    audit.apply(verdict)
    audit.mend_quarantined(entries, verdict.outcomes, owners, payload, iteration)
    _recheck(entries, refs, verdict, audit)
    return verdict.outcomes


def open_folded_groups(audit: EMAudit, entries: list[Any], payload: tuple[Any, Any], iteration: int,
                       audited: Sequence[int], owners: Sequence[int], token: str,
                       revealed: dict[int, Any] | None = None) -> tuple[ChunkAudit, ...]:
    """Open the folded groups holding ``audited`` chunks: their workers reveal the chunks' own results, which
    must match the commitments, and the driver's fold of them must be the sum that came back (``fold_binding``).
    Opened groups whose results match their commitments enter ``entries`` per chunk. ``revealed``: chunks the
    workers already revealed in this pass."""
    groups = [(a, b) for a, b in opened_groups(entries, audited) if owners[b - 1] not in audit.quarantined]
    if not groups:
        return ()
    wanted = [c for a, b in groups for c in range(a, b)]
    if revealed is None or any(c not in revealed for c in wanted):  # not revealed with the references
        revealed = reveal_chunks(audit.runner, audit.placement, wanted, owners, payload, token)
    evidence = []
    for a, b in groups:
        group, shipped = entries[b - 1], [revealed[c] for c in range(a, b)]
        values = [opened(v, c) for c, v in zip(range(a, b), shipped)]  # first: a seal that is no result is refused
        digests = tuple(commit_digest(v) for v in shipped)  # a sealed result's bytes are hashed, not pickled again
        expected = fold_digest(group.digests, fold_group(payload[0], values))
        evidence.append(FoldEvidence(a, b - 1, owners[b - 1], expected, fold_digest(digests, group)))
        if digests == tuple(group.digests):
            entries[a:b] = values  # the chunks the pass committed to, folded by the driver, stand for the group
    replays = {g.first: refold_on(audit.runner, audit.placement, (g.first, g.last + 1), len(entries), g.worker,
                                  payload, f"{token}:replay")
               for g in evidence if g.expected != g.observed}
    verdict = judge_folds(evidence, replays, iteration=iteration, policy=audit.auditor.policy,
                          healthy=audit.healthy() if audit.placement else (), may_quarantine=audit.placement)
    audit.apply(verdict)
    audit.mend_quarantined(entries, verdict.outcomes, owners, payload, iteration)
    return verdict.outcomes


def _recheck(entries: list[Any], references: dict[int, Any], verdict: Verdict, audit: EMAudit) -> None:
    """After a quarantine, the recomputed chunk must agree with its reference, else nothing mended it."""
    for outcome in verdict.outcomes:
        if outcome.quarantined is None:
            continue
        ok, _, _ = within_tolerance(entries[outcome.chunk], references[outcome.chunk], audit.tolerance.atol,
                                    audit.tolerance.rtol)
        if not ok:
            raise SDCDetectedError(outcome.records)


# ---- around the pass: findings, fold, receipt ----------------------------------------------------------
def audited_entries(audit: EMAudit, ledger: RunLedger | None, estimator: Any, model: Any, *, iteration: int,
                    num_chunks: int, encoder: Any, first_of_fit: bool) -> tuple[list[Any], tuple[ChunkAudit, ...]]:
    """The entries and outcomes of one audited pass (the audit picks it: ``reference_pass`` above, the peer
    replays without a reference, mixle's named draw); what the audit found reaches ``ledger`` even when it
    raises."""
    try:
        return audit.estep_results(estimator, model, iteration, num_chunks=num_chunks, encoder=encoder,
                                   first_of_fit=first_of_fit)
    finally:
        write_findings(ledger, audit.take_events())


def write_findings(ledger: RunLedger | None, events: Sequence[AuditEvent]) -> None:
    """The audit's findings (records and notes, in order) written to the run's ledger (none: dropped)."""
    if ledger is None:
        return
    for event in events:
        if isinstance(event, AuditNote):
            ledger.note(event.message, **event.fields)
        else:
            ledger.audit(event)


def folded_result(estimator: Any, entries: list[Any], fold: Callable[[Any, list[Any]], Any]) -> EStepResult:
    """The pass's entries folded in the fixed order by ``fold`` (``fold_pass``, or a guarded one) and the
    M-step on the total."""
    total = fold(estimator, entries)
    nobs, ll, stats = total.count, total.log_likelihood, total.stats
    return EStepResult(nobs, ll, stats, estimator.estimate(nobs, stats))


def record_receipt(ledger: RunLedger | None, iteration: int, result: EStepResult, **fields: Any) -> StepReceipt:
    """The pass's receipt (``em_receipt``: rows, log-likelihood, ``fields``) written to ``ledger`` where there
    is one."""
    receipt = em_receipt(iteration, result.nobs, result.log_likelihood, **fields)
    if ledger is not None:
        ledger.receipt(receipt)
    return receipt


# ---- the references -----------------------------------------------------------------------------------
@attrs.frozen(eq=False)
class DriverReference:
    """The audited chunks rebuilt in this process, outside the backend's runner and transport (``read``: chunk ids
    and the pass's encoder to their encoded chunks, in that order), and E-stepped here. ``encoded`` alone lets a
    fit judge several passes' samples from one read (``deferred_judging``)."""

    read: Callable[[Sequence[int], Any], list[EncodedChunk]]

    def encoded(self, chunks: Sequence[int], encoder: Any) -> dict[int, EncodedChunk]:
        """The chunks rebuilt here with ``encoder``, by chunk id (one read for all of them where the source batches)."""
        if encoder is None:
            raise RuntimeError("the audit's reference runs after the handle's chunks are encoded")
        return dict(zip(chunks, self.read(list(chunks), encoder), strict=True)) if chunks else {}

    def __call__(self, chunks: Sequence[int], encoder: Any, estimator: Any, model: Any) -> dict[int, ChunkResult]:
        return {c: chunk_estep(chunk, (estimator, model)) for c, chunk in self.encoded(chunks, encoder).items()}


def rows_reference(rows: Any, bounds: Sequence[tuple[int, int]]) -> DriverReference:
    """The chunks' E-steps recomputed in the driver from ``rows`` (kept by the handle) with the pass's encoder."""

    def read(chunks: Sequence[int], encoder: Any) -> list[EncodedChunk]:
        return [EncodedChunk(c, bounds[c][0], bounds[c][1], encoder.encode(rows[bounds[c][0]:bounds[c][1]]))
                for c in chunks]

    return DriverReference(read)


def source_reference(source: OpenedSource | None, places: Sequence[ChunkPlace] | None) -> DriverReference | None:
    """For rows read where they live: the audited chunks fetched again into this process by their place in the
    source (file or partition, row offset), all of a pass's in one request where the source can batch
    (``OpenedSource.read_chunks``), encoded and E-stepped here, outside the backend; None for a source that
    cannot read one chunk alone."""
    if source is None or places is None or not source.reads_chunks:
        return None
    opened, where = source, places
    opened.prepare_reads()

    def read(chunks: Sequence[int], encoder: Any) -> list[EncodedChunk]:
        return list(opened.read_chunks([where[c] for c in chunks], encoder))

    return DriverReference(read)
