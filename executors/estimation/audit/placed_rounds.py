"""The audit's work placed on chosen healthy workers (a runner that places work: local, mp, dask, ray).

Each chunk's worker (:func:`owners_on`: the runner's resident placement where its owners are healthy, else
blocks over the healthy workers), one placed round of chosen chunks on chosen workers with the planned faults
struck inside the workers (:func:`placed_round`), a function over the chunks on the healthy workers only
(:func:`placed_map`), a pass's committed round on them (:func:`committed_round`) and the mending of the groups a
quarantined worker or a decided chunk touched (:func:`mend`). A worker lost during a round is noted and its
chunks move to the others; when none is left a ``WorkerLostError`` says to create a new handle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..backends.chunk_assignment import block_assignment
from ..em_pass.chunks import (
    GroupFold,
    WorkerLostError,
    WorkerTask,
    WorkerUnavailableError,
    chunk_estep,
    group_of,
)
from ..em_pass.runner_protocols import ChunkOwnership
from .audit_injection import chunk_estep_struck

if TYPE_CHECKING:
    from .sdc_audit import EMAudit

__all__ = ["committed_round", "healthy_or_raise", "mend", "note_lost", "owners_on", "placed_map", "placed_round"]


def owners_on(runner: object, num_chunks: int, healthy: Sequence[int]) -> list[int]:
    """The worker each chunk runs on: the runner's resident owners where they are healthy, else blocks of chunks
    over the ``healthy`` workers."""
    preferred = list(runner.chunk_owners()) if isinstance(runner, ChunkOwnership) else []
    if len(preferred) == num_chunks and all(w in healthy for w in preferred):
        return preferred
    owners = [0] * num_chunks
    for w, ids in zip(healthy, block_assignment(num_chunks, len(healthy))):
        for c in ids:
            owners[c] = w
    if len(preferred) == num_chunks:  # keep resident placement where the owner is still healthy
        owners = [p if p in healthy else o for p, o in zip(preferred, owners)]
    return owners


def healthy_or_raise(audit: EMAudit) -> list[int]:
    """The live workers not quarantined; a ``WorkerLostError`` when none is left."""
    healthy = audit.healthy()
    if not healthy:
        raise WorkerLostError(
            f"no healthy worker left (quarantined {sorted(audit.quarantined)}, lost {sorted(audit.lost)}); "
            "create a new handle on replaced hardware"
        )
    return healthy


def note_lost(audit: EMAudit, exc: WorkerUnavailableError) -> None:
    """Remember the workers ``exc`` lost (they get no chunks) and note it for the ledger."""
    audit.lost.update(exc.workers)
    audit.findings.note(f"worker(s) {list(exc.workers)} lost during an audited pass; their chunks move to "
                        "the healthy workers", workers=list(exc.workers))


def placed_round(audit: EMAudit, jobs: dict[int, list[int]], estimator: Any, model: Any, iteration: int | None,
                 struck: set[tuple[int, int]], fold: GroupFold | None = None) -> dict[tuple[int, int], Any]:
    """Compute ``jobs`` (worker -> chunk ids) in one placed round; strike planned flips inside workers.

    With ``fold``, a worker without planned flips folds its complete groups, bringing back the own
    results of ``fold.raw`` (the audited chunks, read with ``chunk_result``); the entries are then
    for ``fold_pass``."""
    tasks: dict[int, WorkerTask] = {}
    for w, ids in jobs.items():
        if not ids:
            continue
        flips: dict[int, tuple[tuple[int, int], ...]] = {}
        if audit.injector is not None and iteration is not None:
            for c in ids:
                found = []
                while (flip := audit.injector.claim("statistic", f"chunk:{c}", rank=w, step=iteration)) is not None:
                    found.append((flip.index, flip.bit))
                if found:
                    flips[c] = tuple(found)
                    struck.add((w, c))
        if flips:
            tasks[w] = WorkerTask(chunk_estep_struck, (estimator, model, flips), tuple(ids))
        else:
            tasks[w] = WorkerTask(  # GroupFold is callable through its __call__, unseen by mypy on a NamedTuple
                fold if fold is not None else chunk_estep,  # type: ignore[arg-type]  # NamedTuple __call__
                (estimator, model),
                tuple(ids),
            )
    out = audit.placer.run_on_workers(tasks)
    return {(w, c): value for w, task in tasks.items() for c, value in zip(task.chunk_ids, out[w])}


def placed_map(audit: EMAudit, fn: Callable[[Any, Any], Any], payload: Any, num_chunks: int,
               ids: Sequence[int] | None = None) -> list[Any]:
    """``fn`` over the chunks, only on healthy workers; results in chunk order."""
    wanted = list(range(num_chunks)) if ids is None else sorted(ids)
    for _ in range(len(audit.placer.worker_ids()) + 1):
        owners = owners_on(audit.runner, num_chunks, healthy_or_raise(audit))
        jobs: dict[int, list[int]] = {}
        for c in wanted:
            jobs.setdefault(owners[c], []).append(c)
        try:
            out = audit.placer.run_on_workers({w: WorkerTask(fn, payload, tuple(cs)) for w, cs in jobs.items()})
        except WorkerUnavailableError as exc:
            note_lost(audit, exc)
            continue
        values = {c: v for w, cs in jobs.items() for c, v in zip(cs, out[w])}
        return [values[c] for c in wanted]
    raise WorkerLostError("workers kept dying during one pass; create a new handle")


def committed_round(audit: EMAudit, estimator: Any, model: Any, iteration: int, n: int,
                    struck: set[tuple[int, int]], token: str = "") -> list[Any]:
    """The pass on the healthy workers only (planned flips struck), groups committed to their digests."""
    for _ in range(len(audit.placer.worker_ids()) + 1):
        owners = owners_on(audit.runner, n, healthy_or_raise(audit))
        jobs: dict[int, list[int]] = {}
        for c in range(n):
            jobs.setdefault(owners[c], []).append(c)
        try:
            values = placed_round(audit, jobs, estimator, model, iteration, struck,
                                  GroupFold(chunk_estep, n, frozenset(), True, token))
        except WorkerUnavailableError as exc:
            note_lost(audit, exc)
            continue
        return [values[(owners[c], c)] for c in range(n)]
    raise WorkerLostError("workers kept dying during one audited pass; create a new handle")


def mend(audit: EMAudit, entries: list[Any], decided: dict[int, Any], owners: Sequence[int], estimator: Any,
         model: Any) -> None:
    """Recompute, per chunk on healthy workers, the chunks of a quarantined worker and every group holding
    one of them or a chunk whose audited statistic is not its primary's (a group folded with a bad chunk in
    it cannot be mended in place); the audit's own statistic stands for the decided chunks."""
    n = len(entries)
    touched = {group_of(n, c) for c in range(n) if owners[c] in audit.quarantined} | {
        group_of(n, c) for c in decided}
    redo = sorted(c for a, b in touched for c in range(a, b) if c not in decided)
    if redo:
        for c, value in zip(redo, placed_map(audit, chunk_estep, (estimator, model), n, redo)):
            entries[c] = value
    for c, value in decided.items():
        entries[c] = value
