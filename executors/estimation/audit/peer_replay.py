"""The EM audit without a reference: each audited chunk recomputed through the backend and compared with itself.

On a runner that places work one round computes every chunk on its primary *and* every audited chunk on the
next healthy worker in ring order; ``EMAuditor.audit_chunk`` compares the two by ``statistic_digest``, a third
worker witnesses a mismatch and the majority names the faulty worker, which is quarantined (its chunks, and
every group holding one of them, recomputed on the others). With one healthy worker left the chunk is replayed
on its own worker. Runners without placement (mpi, spark) replay an audited chunk on the same runner
(``same_rank``). This is the audit of a source that cannot read one chunk alone, and the peer half of mixle's
named draw (``named_draw``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ....contracts.estimation import statistic_digest
from ....verification.sdc.em import ChunkAudit
from ..em_pass.chunks import GroupFold, GroupStats, WorkerLostError, WorkerUnavailableError, chunk_estep, chunk_result
from .placed_rounds import healthy_or_raise, mend, note_lost, owners_on, placed_round

if TYPE_CHECKING:
    from .sdc_audit import EMAudit

__all__ = ["backend_pass"]


def backend_pass(audit: EMAudit, payload: tuple[Any, Any], iteration: int, n: int,
                 audited: tuple[int, ...], token: str = "") -> tuple[list[Any], tuple[ChunkAudit, ...]]:
    """The pass through the backend, audited chunks replayed on a peer (or on the same runner); with a
    ``token`` every folded group also commits to its chunks' digests and keeps their results."""
    if not audit.placement:
        return _same_runner(audit, payload, iteration, n, audited, token)
    pending = audit.injection_pending(iteration)
    if not audited and not audit.excluded and not pending:
        return audit.fold_entries(payload, n, commit=bool(token), token=token), ()
    for _ in range(len(audit.placer.worker_ids()) + 1):
        try:
            return _placed_pass(audit, *payload, iteration, n, audited, token)
        except WorkerUnavailableError as exc:
            note_lost(audit, exc)
    raise WorkerLostError("workers kept dying during one audited pass; create a new handle")


def _ring_next(healthy: Sequence[int], primary: int) -> int | None:
    """The worker ``EMAuditor`` picks as the auditor of ``primary``'s chunk: next healthy in ring order."""
    if not healthy:
        return None
    begin = healthy.index(primary) if primary in healthy else 0
    ring = list(healthy[begin:]) + list(healthy[:begin])
    others = [w for w in ring if w != primary]
    return others[0] if others else None


def _placed_pass(audit: EMAudit, estimator: Any, model: Any, iteration: int, n: int,
                 audited: tuple[int, ...], token: str = "") -> tuple[list[Any], tuple[ChunkAudit, ...]]:
    """One placed pass, each audited chunk also computed on its ring peer in the same round; then the
    audit, and the mending of what it found."""
    healthy = healthy_or_raise(audit)
    owners = owners_on(audit.runner, n, healthy)
    jobs: dict[int, list[int]] = {}
    for c in range(n):
        jobs.setdefault(owners[c], []).append(c)
    for c in audited:
        w = _ring_next(healthy, owners[c])
        if w is not None:
            jobs.setdefault(w, []).append(c)
    struck: set[tuple[int, int]] = set()
    values = placed_round(audit, jobs, estimator, model, iteration, struck,
                          GroupFold(chunk_estep, n, frozenset(audited), bool(token), token))
    entries = [values[(owners[c], c)] for c in range(n)]
    outcomes, decided = _peer_audits(audit, entries, values, owners, (estimator, model), iteration, audited, struck)
    for outcome in outcomes:
        if outcome.quarantined is not None:
            audit.findings.note(f"worker {outcome.quarantined} quarantined after a witnessed mismatch on "
                                f"chunk {outcome.chunk} at iteration {iteration}; its chunks are recomputed on "
                                "the others", worker=outcome.quarantined, chunk=outcome.chunk, iteration=iteration)
    mend(audit, entries, decided, owners, estimator, model)
    return entries, tuple(outcomes)


def _peer_audits(audit: EMAudit, entries: list[Any], values: dict[tuple[int, int], Any], owners: list[int],
                 payload: tuple[Any, Any], iteration: int, audited: tuple[int, ...],
                 struck: set[tuple[int, int]]) -> tuple[list[ChunkAudit], dict[int, Any]]:
    """Each audited chunk against its peer's replay (a witness on a mismatch; one worker left: a same-worker
    replay); the outcomes and the statistics the audit decided on where they are not the primary's."""
    estimator, model = payload
    outcomes: list[ChunkAudit] = []
    decided: dict[int, Any] = {}
    live = audit.live()
    for c in audited:
        primary = chunk_result(entries, c)
        if len(audit.auditor.healthy(live)) < 2:
            replay = placed_round(audit, {owners[c]: [c]}, estimator, model, iteration, struck)[(owners[c], c)]
            outcome = audit.auditor.audit_same_worker(
                iteration=iteration, chunk=c, worker=owners[c], statistic=primary, replayed=replay,
                injected=any(k[1] == c for k in struck))
        else:
            def recompute(worker: int, c: int = c) -> Any:
                if (worker, c) not in values:
                    values.update(placed_round(audit, {worker: [c]}, estimator, model, iteration, struck))
                value = values[(worker, c)]
                return chunk_result([value], 0) if isinstance(value, GroupStats) else value

            outcome = audit.auditor.audit_chunk(
                iteration=iteration, chunk=c, primary=owners[c], statistic=primary, recompute=recompute,
                workers=live, injected=any(k[1] == c for k in struck))
        if outcome.statistic is not primary and statistic_digest(outcome.statistic) != statistic_digest(primary):
            decided[c] = outcome.statistic
        if outcome.quarantined is not None:
            decided.setdefault(c, outcome.statistic)
        outcomes.append(outcome)
    return outcomes, decided


def _same_runner(audit: EMAudit, payload: tuple[Any, Any], iteration: int, n: int,
                 audited: tuple[int, ...], token: str = "") -> tuple[list[Any], tuple[ChunkAudit, ...]]:
    """The pass on the runner, each audited chunk replayed on the same runner (``same_rank``)."""
    results = audit.fold_entries(payload, n, audited, commit=bool(token), token=token)
    if not audited:
        return results, ()
    replays = audit.runner.map_chunks(chunk_estep, payload, chunk_ids=list(audited))
    owners = audit.chunk_owners(len(results))
    outcomes = []
    for c, replay in zip(audited, replays):
        outcomes.append(
            audit.auditor.audit_same_worker(
                iteration=iteration, chunk=c, worker=owners[c], statistic=chunk_result(results, c), replayed=replay
            )
        )
    return results, tuple(outcomes)
