"""Binding each opened combine group's folded sum to its chunks' committed results (the EM reference audit).

A worker folds each combine group it holds whole and returns one sum and, per chunk, a digest of the chunk's
own result (``GroupFold(commit=True)``); the chunk audit binds an audited chunk's digest to the reference.
This binds the sum to the digests: once the pass is in, each folded group holding an audited chunk (a secret
sample, so the backend cannot tell which groups will be opened when it returns the pass) is opened. The
worker that folded it kept its chunks' own results for the pass (``GroupFold(retain=token)``) and hands them
back in one follow-up round (``GroupReveal``: no E-step recomputed where the worker kept them); each must
match its digest bitwise, and the driver folds them with ``fold_group`` and compares bitwise with the sum that
came back. A mismatch is replayed (the group folded and revealed again on the same worker, through the
backend): reproduced, a ``backend_defect``; not, a ``device`` fault (``audit_judge.judge_folds``, applied by
``estep.open_folded_groups``). An opened
group whose results match their digests then enters the pass per chunk, so the driver's fold stands for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..em_pass.chunks import ChunkRunner, WorkerTask, chunk_estep
from ..em_pass.combine_order import GroupFold, GroupReveal, GroupStats, commit_digest, fold_group, group_of
from ..em_pass.runner_protocols import WorkerPlacement

__all__ = ["fold_digest", "opened_groups", "refold_on", "reveal_chunks"]


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


def reveal_chunks(runner: ChunkRunner, placement: bool, ids: Sequence[int], owners: Sequence[int], payload: Any,
                  token: str) -> dict[int, Any]:
    """The own results of ``ids`` the workers that folded them kept under ``token``: one round, each chunk on
    its owner (``placement``: ``run_on_workers``), or the runner's own placement otherwise (SPMD: the owner
    rank, all-gathered)."""
    reveal = GroupReveal(chunk_estep, token)
    if not placement:
        return dict(zip(ids, runner.map_chunks(reveal, payload, chunk_ids=list(ids))))  # type: ignore[arg-type]  # NamedTuple __call__
    assert isinstance(runner, WorkerPlacement)  # placement is declared by a WorkerPlacement only (places_work)
    jobs: dict[int, list[int]] = {}
    for c in ids:
        jobs.setdefault(owners[c], []).append(c)
    out = runner.run_on_workers({w: WorkerTask(reveal, payload, tuple(cs))  # type: ignore[arg-type]
                                 for w, cs in jobs.items()})
    return {c: v for w, cs in jobs.items() for c, v in zip(cs, out[w])}


def refold_on(runner: ChunkRunner, placement: bool, group: tuple[int, int], num_chunks: int, worker: int, payload: Any,
              token: str) -> str:
    """The group folded (committed, kept) and revealed again on ``worker`` through the backend: its observed
    :func:`fold_digest`, to compare with the pass's (a group that comes back unfolded is folded here)."""
    a, b = group
    fold = GroupFold(chunk_estep, num_chunks, frozenset(), True, token)
    ids = list(range(a, b))
    if placement:
        assert isinstance(runner, WorkerPlacement)  # placement is declared by a WorkerPlacement only (places_work)
        entries = runner.run_on_workers({worker: WorkerTask(fold, payload, tuple(ids))})[worker]  # type: ignore[arg-type]
    else:
        entries = runner.map_chunks(fold, payload, chunk_ids=ids)  # type: ignore[arg-type]  # NamedTuple __call__
    total = entries[-1]
    if not (isinstance(total, GroupStats) and len(total.digests) == b - a):
        return fold_digest([commit_digest(v) for v in entries], fold_group(payload[0], entries))
    revealed = reveal_chunks(runner, placement, ids, [worker] * num_chunks, payload, token)
    return fold_digest([commit_digest(revealed[c]) for c in ids], total)
