"""Binding each opened combine group's folded sum to its chunks' committed results (the EM reference audit).

A worker folds each combine group it holds whole and returns one sum and, per chunk, a digest of the chunk's
own result (``GroupFold(commit=True)``); the chunk audit binds an audited chunk's digest to the reference.
This binds the sum to the digests: once the pass is in, each folded group holding an audited chunk (a secret
sample, so the backend cannot tell which groups will be opened when it returns the pass) is opened. The
worker that folded it kept its chunks' own results for the pass (``GroupFold(retain=token)``) and hands them
back in one follow-up round (``GroupReveal``: no E-step recomputed where the worker kept them); each must
match its digest bitwise, and the driver folds them with ``fold_group`` and compares bitwise with the sum that
came back. A mismatch is replayed (the group folded and revealed again on the same worker, through the
backend): reproduced, a ``backend_defect``; not, a ``device`` fault (``EMAuditor.audit_fold``). An opened
group whose results match their digests then enters the pass per chunk, so the driver's fold stands for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ....verification.sdc.em import ChunkAudit
from ..em_pass.chunks import WorkerTask, chunk_estep
from ..em_pass.combine_order import GroupFold, GroupReveal, GroupStats, commit_digest, fold_group, group_of

__all__ = ["bind_folded_sums", "fold_digest", "opened_groups"]


def opened_groups(entries: Sequence[Any], audited: Sequence[int]) -> list[tuple[int, int]]:
    """The folded, committed groups ``[a, b)`` holding an audited chunk (never more than the audited chunks)."""
    n = len(entries)
    out = []
    for a, b in sorted({group_of(n, c) for c in audited}):
        group = entries[b - 1]
        if b - a > 1 and isinstance(group, GroupStats) and len(group.digests) == b - a:
            out.append((a, b))
    return out


def fold_digest(digests: Sequence[str], total: Any) -> str:
    """One digest of a group's chunk digests and its folded ``(count, log_likelihood, stats)``, bit for bit."""
    return commit_digest((tuple(digests), float(total[0]), float(total[1]), total[2]))


def _reveal(audit: Any, ids: Sequence[int], owners: Sequence[int], payload: Any, token: str) -> dict[int, Any]:
    """The own results of ``ids`` the workers that folded them kept under ``token``: one round, each chunk on
    its owner (placement), or the runner's own placement otherwise (SPMD: the owner rank, all-gathered)."""
    reveal = GroupReveal(chunk_estep, token)
    if not audit.placement:
        return dict(zip(ids, audit.runner.map_chunks(reveal, payload, chunk_ids=list(ids))))
    jobs: dict[int, list[int]] = {}
    for c in ids:
        jobs.setdefault(owners[c], []).append(c)
    out = audit.runner.run_on_workers({w: WorkerTask(reveal, payload, tuple(cs))  # type: ignore[arg-type]
                                       for w, cs in jobs.items()})
    return {c: v for w, cs in jobs.items() for c, v in zip(cs, out[w])}


def _replay(audit: Any, group: tuple[int, int], num_chunks: int, worker: int, payload: Any, token: str) -> str:
    """The group folded (committed, kept) and revealed again on ``worker`` through the backend: its observed
    :func:`fold_digest`, to compare with the pass's (a group that comes back unfolded is folded here)."""
    a, b = group
    fold = GroupFold(chunk_estep, num_chunks, frozenset(), True, token)
    ids = list(range(a, b))
    if audit.placement:
        entries = audit.runner.run_on_workers({worker: WorkerTask(fold, payload, tuple(ids))})[worker]  # type: ignore[arg-type]
    else:
        entries = audit.runner.map_chunks(fold, payload, chunk_ids=ids)
    total = entries[-1]
    if not (isinstance(total, GroupStats) and len(total.digests) == b - a):
        return fold_digest([commit_digest(v) for v in entries], fold_group(payload[0], entries))
    revealed = _reveal(audit, ids, [worker] * num_chunks, payload, token)
    return fold_digest([commit_digest(revealed[c]) for c in ids], total)


def bind_folded_sums(audit: Any, entries: list[Any], payload: tuple[Any, Any], iteration: int,
                     audited: Sequence[int], owners: Sequence[int], token: str) -> tuple[ChunkAudit, ...]:
    """Open the folded groups holding ``audited`` chunks and check each sum against its committed chunks (see
    the module); opened groups whose results match their digests are put into ``entries`` per chunk."""
    groups = opened_groups(entries, audited)
    if not groups:
        return ()
    revealed = _reveal(audit, [c for a, b in groups for c in range(a, b)], owners, payload, token)
    spare = audit.placement and len(audit.healthy()) >= 2
    outcomes = []
    for a, b in groups:
        if owners[b - 1] in audit.auditor.quarantined:  # quarantined in this pass: its chunks are recomputed
            continue
        group, values = entries[b - 1], [revealed[c] for c in range(a, b)]
        digests = [commit_digest(v) for v in values]

        def replay(group_range: tuple[int, int] = (a, b), worker: int = owners[b - 1]) -> str:
            return _replay(audit, group_range, len(entries), worker, payload, f"{token}:replay")

        outcome = audit.auditor.audit_fold(
            iteration=iteration, first=a, last=b - 1, worker=owners[b - 1],
            expected=fold_digest(group.digests, fold_group(payload[0], values)), observed=fold_digest(digests, group),
            replay=replay, can_quarantine=spare)
        if tuple(digests) == tuple(group.digests):
            entries[a:b] = values  # the chunks the pass committed to, folded by the driver, stand for the group
        outcomes.append(outcome)
        if outcome.quarantined is not None:
            spare = len(audit.healthy()) >= 2
    return tuple(outcomes)
