"""A NaN/Inf check at every combine of a pass, naming the chunk and the worker that produced it.

:func:`guarded_fold_pass` folds a pass's entries in exactly the order of ``fold_pass`` (chunks in
order within the fixed combine groups, then the groups), so its bits are those of the unguarded
fold; it checks each entry before it is combined and the running statistic after every combine,
and raises :class:`NonFiniteStatisticError` at the first non-finite value: which chunk (or run of
chunks folded on a worker), which worker, which element. :func:`finite_guarded_fold` is mixle's
name for it (returning ``(nobs, stats)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .combine_order import GroupStats, combine_groups

__all__ = [
    "NonFiniteStatisticError", "check_chunk_result", "finite_guarded_fold", "first_non_finite", "guarded_fold_pass",
]


class NonFiniteStatisticError(FloatingPointError):
    """A chunk's statistic (or a combine of it) holds a NaN or Inf; ``chunks`` and ``workers`` say whose."""

    def __init__(self, message: str, *, chunks: tuple[int, int], workers: tuple[int, ...], element: str,
                 stage: str) -> None:
        super().__init__(message)
        self.chunks = chunks
        """``[first, last]`` chunk ids of the entry (equal for a single chunk)."""
        self.workers = workers
        self.element = element
        self.stage = stage
        """``entry`` (the worker sent it so) or ``combine`` (it appeared while combining on the driver)."""

    @property
    def chunk(self) -> int | None:
        """The chunk id when the entry is a single chunk."""
        return self.chunks[0] if self.chunks[0] == self.chunks[1] else None


def first_non_finite(value: Any, path: str = "stats") -> str | None:
    """Path of the first NaN/Inf element of a statistic (arrays, floats, tuples, lists, dicts), or None."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            bad = np.flatnonzero(~np.isfinite(value))
            if bad.size:
                idx = np.unravel_index(int(bad[0]), value.shape)
                return f"{path}[{', '.join(str(int(i)) for i in idx)}] = {value[idx]!r}"
        return None
    if isinstance(value, (float, np.floating, complex, np.complexfloating)):
        return None if np.isfinite(value) else f"{path} = {value!r}"
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            hit = first_non_finite(v, f"{path}[{i}]")
            if hit is not None:
                return hit
        return None
    if isinstance(value, Mapping):
        for k in sorted(value, key=str):
            hit = first_non_finite(value[k], f"{path}[{k!r}]")
            if hit is not None:
                return hit
    return None


def _as_entry(entry: Any, chunk: int) -> Any:
    if entry is None or isinstance(entry, GroupStats):
        return entry
    if isinstance(entry, tuple) and len(entry) == 2:  # mixle's (count, stats) payload
        return (entry[0], 0.0, entry[1])
    if isinstance(entry, tuple) and len(entry) == 3:
        return entry
    raise TypeError(f"entry of chunk {chunk} is a {type(entry).__name__}; expected (count, log_likelihood, stats), "
                    "(count, stats) or a GroupStats")


class _Guard:
    """Raises for a non-finite value, with the chunks and workers of the entry it belongs to."""

    def __init__(self, where: str, workers_of: Callable[[int], tuple[int, ...]]) -> None:
        self.where, self.workers_of = where, workers_of

    def check(self, value: Any, a: int, b: int, stage: str, what: str) -> None:
        bad = first_non_finite(value, what)
        if bad is None:
            return
        workers = tuple(sorted({w for c in range(a, b + 1) for w in self.workers_of(c)}))
        who = f"worker(s) {list(workers)}" if workers else "an unknown worker"
        unit = f"chunk {a}" if a == b else f"chunks {a}..{b} (folded on the worker)"
        how = "came back non-finite from" if stage == "entry" else "turned non-finite when combined on the driver, from"
        raise NonFiniteStatisticError(
            f"{self.where}: {unit} {how} {who}: {bad}. Check those rows for NaN/Inf or out-of-range values, or "
            "the worker's hardware if the same chunk is finite elsewhere",
            chunks=(a, b), workers=workers, element=bad, stage=stage)


def check_chunk_result(result: Any, chunk: int, workers: Sequence[int] = (), *, where: str = "EM combine") -> None:
    """Raise :class:`NonFiniteStatisticError` when one chunk's ``(count, log_likelihood, stats)`` is not finite."""
    guard = _Guard(where, lambda _: tuple(int(w) for w in workers))
    guard.check(float(result[0]), chunk, chunk, "entry", "count")
    guard.check(result[2], chunk, chunk, "entry", "stats")


def _fold_checked(estimator: Any, results: list[tuple[int, int, Any]], guard: _Guard) -> GroupStats:
    """``fold_group`` with checks: same operations in the same order; ``results`` = (first, last, entry)."""
    for a, b, r in results:
        guard.check(float(r[0]), a, b, "entry", "count")
        guard.check(r[2], a, b, "entry", "stats")
    if len(results) == 1:
        r = results[0][2]
        return GroupStats(float(r[0]), float(r[1]), r[2])
    acc = estimator.accumulator_factory().make()
    count = ll = 0.0
    for a, b, r in results:
        count += float(r[0])
        ll += float(r[1])
        acc.combine(r[2])
        guard.check(acc.value(), a, b, "combine", "running stats")
        guard.check(count, a, b, "combine", "running count")
    return GroupStats(count, ll, acc.value())


def guarded_fold_pass(estimator: Any, entries: Sequence[Any], *, where: str = "EM combine",
                      workers: Mapping[int, Sequence[int]] | Sequence[Any] | None = None) -> GroupStats:
    """``fold_pass`` with a finiteness check of every entry and after every combine (module doc).

    ``workers`` maps a chunk id to the worker(s) that computed it (a mapping, or a sequence indexed by
    chunk id of ints or lists), for the message; the log-likelihood is not checked (it may be -inf).
    """
    def workers_of(c: int) -> tuple[int, ...]:
        if workers is None:
            return ()
        try:
            got: Any = workers[c]
        except (KeyError, IndexError):
            return ()
        return tuple(int(w) for w in got) if isinstance(got, (list, tuple)) else (int(got),)

    guard = _Guard(where, workers_of)
    items = [_as_entry(e, c) for c, e in enumerate(entries)]
    parts: list[tuple[int, int, Any]] = []
    for a, b in combine_groups(len(items)):
        group = items[a:b]
        last = group[-1]
        if isinstance(last, GroupStats) and not any(isinstance(e, GroupStats) for e in group[:-1]):
            _fold_checked(estimator, [(a, b - 1, last)], guard)
            parts.append((a, b - 1, last))
        elif all(e is not None and not isinstance(e, GroupStats) for e in group):
            parts.append((a, b - 1, _fold_checked(estimator, [(a + i, a + i, e) for i, e in enumerate(group)], guard)))
        else:
            raise RuntimeError(f"chunks {a}..{b - 1} came back partly folded; this is a bug in the runner")
    if not parts:
        return GroupStats(0.0, 0.0, estimator.accumulator_factory().make().value())
    return _fold_checked(estimator, parts, guard)


def finite_guarded_fold(estimator: Any, payloads: Sequence[Any], where: str = "finite_guarded_fold", *,
                        workers: Mapping[int, Sequence[int]] | Sequence[Any] | None = None) -> tuple[float, Any]:
    """mixle's name: fold per-chunk ``(count, stats)`` or ``(count, log_likelihood, stats)`` payloads in
    chunk order, checking every one and every combine; returns ``(nobs, stats)``."""
    total = guarded_fold_pass(estimator, payloads, where=where, workers=workers)
    if not math.isfinite(total.count):  # pragma: no cover - caught at the combine above
        raise FloatingPointError(f"{where}: the total row count is {total.count}")
    return total.count, total.stats
