"""Backends that commit honest chunk digests but return a wrong folded sum outside the harness (issue 23 item 5).

``cheating_apply(apply_chunk_fn, how)`` wraps a runner's ``apply_chunk_fn``: while the verification harness is
active it is the original; otherwise every folded group (a ``GroupStats``) comes back
with its chunks' honest digests and a wrong sum -- ``scale``: its statistics times 1.5; ``drop``: folded
without its first chunk. Replays through the backend reproduce it (it is deterministic: a backend defect).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mixle_parallel.executors.estimation.em_pass.chunks import chunk_estep
from mixle_parallel.executors.estimation.em_pass.combine_order import GroupFold, GroupStats, fold_group, group_of
from mixle_parallel.verification.capability import active_harness_capability

ApplyChunkFn = Callable[[Any, Any, Sequence[int], Callable[[int], Any]], list[Any]]


def scaled(stats: Any, factor: float) -> Any:
    """``stats`` with every float and float array multiplied by ``factor`` (structure kept)."""
    if isinstance(stats, tuple) and hasattr(stats, "_fields"):
        return type(stats)(*(scaled(s, factor) for s in stats))
    if isinstance(stats, (tuple, list)):
        return type(stats)(scaled(s, factor) for s in stats)
    if isinstance(stats, np.ndarray) and stats.dtype.kind == "f":
        return stats * factor
    if isinstance(stats, float):
        return stats * factor
    return stats


def wrong_sum(group: GroupStats, chunks: range, payload: Any, chunk_of: Callable[[int], Any], how: str) -> GroupStats:
    """``group`` (of ``chunks``) with its digests kept and its sum made wrong the ``how`` way."""
    if how == "scale":
        return group._replace(stats=scaled(group.stats, 1.5))
    if how == "drop":
        rest = [chunk_estep(chunk_of(j), payload) for j in chunks[1:]]
        return fold_group(payload[0], rest)._replace(last=group.last, digests=group.digests)
    raise ValueError(f"unknown cheat {how!r}: use 'scale' or 'drop'")


def cheating_apply(original: ApplyChunkFn, how: str) -> ApplyChunkFn:
    """``original`` (a runner's ``apply_chunk_fn``), with wrong folded sums outside the harness (see the module)."""

    def apply(fn: Any, payload: Any, ids: Sequence[int], chunk_of: Callable[[int], Any]) -> list[Any]:
        entries = original(fn, payload, ids, chunk_of)
        if active_harness_capability() is not None:
            return entries
        fold = fn
        while not isinstance(fold, GroupFold) and hasattr(fold, "fn"):  # the handle's timing envelope
            fold = fold.fn
        out = []
        for c, entry in zip(ids, entries):
            metered = type(entry).__name__ == "Metered"
            value = entry.value if metered else entry
            if isinstance(value, GroupStats) and isinstance(fold, GroupFold):
                value = wrong_sum(value, range(*group_of(fold.num_chunks, int(c))), payload, chunk_of, how)
                entry = entry._replace(value=value) if metered else value
            out.append(entry)
        return out

    return apply
