"""A NaN/Inf check at every combine of a pass, naming the chunk and the worker that produced it.

:func:`guarded_fold_pass` folds a pass's entries in exactly the order of ``fold_pass`` (chunks in
order within the fixed combine groups, then the groups), so its bits are those of the unguarded
fold; it checks each entry before it is combined and the running statistic after every combine,
and raises :class:`NonFiniteStatisticError` at the first non-finite value: which chunk (or run of
chunks folded on a worker), which worker, which element. :func:`finite_guarded_fold` is mixle's
name for it (returning ``(nobs, stats)``); given mixle 0.8.2's payloads (pickled ``(count, value)``
bytes, or such 2-tuples) it folds them as mixle does: in order, one accumulator, a check after every
combine naming the ``payload index``, then ``key_merge``/``key_replace``.
"""

from __future__ import annotations

import math
import pickle  # nosec B403 - mixle's fold payloads are the caller's own in-memory pickles, never a file
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .combine_order import GroupStats, SealedResult, combine_groups

__all__ = [
    "NonFiniteStatisticError", "check_chunk_result", "decode_payload", "finish_accumulator", "finite_guarded_fold",
    "first_non_finite", "guarded_fold_pass", "is_mixle_payload",
]


class NonFiniteStatisticError(FloatingPointError, ValueError):
    """A chunk's statistic (or a combine of it) holds a NaN or Inf; ``chunks`` and ``workers`` say whose.

    Also a ``ValueError``: mixle 0.8.2's guarded fold raises one."""

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
    if entry is None or isinstance(entry, (GroupStats, SealedResult)):  # a sealed one rides beside its group's sum
        return entry
    if isinstance(entry, tuple) and len(entry) == 2:  # mixle's (count, stats) payload
        return (entry[0], 0.0, entry[1])
    if isinstance(entry, tuple) and len(entry) == 3:
        return entry
    raise TypeError(f"entry of chunk {chunk} is a {type(entry).__name__}; expected (count, log_likelihood, stats), "
                    "(count, stats) or a GroupStats")


def _workers_lookup(workers: Any) -> Callable[[int], tuple[int, ...]]:
    """Chunk id -> the worker(s) that computed it, from a mapping or a sequence of ints or lists (for messages)."""
    def workers_of(c: int) -> tuple[int, ...]:
        if workers is None:
            return ()
        try:
            got: Any = workers[c]
        except (KeyError, IndexError):
            return ()
        return tuple(int(w) for w in got) if isinstance(got, (list, tuple)) else (int(got),)

    return workers_of


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
    workers_of = _workers_lookup(workers)

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


def is_mixle_payload(payload: Any) -> bool:
    """True for mixle 0.8.2's fold payload: pickled bytes (of ``(count, value)``) or a ``(count, value)`` 2-tuple."""
    return isinstance(payload, (bytes, bytearray, memoryview)) or (
        isinstance(payload, tuple) and not isinstance(payload, GroupStats) and len(payload) == 2)


def decode_payload(payload: Any, index: int) -> tuple[Any, ...]:
    """One fold payload as a tuple: mixle's pickled ``(count, value)`` bytes are unpickled (they are the
    caller's own in-memory payloads, as in mixle 0.8.2); ``(count, stats)`` / ``(count, ll, stats)`` as given."""
    value = pickle.loads(bytes(payload)) if isinstance(payload, (bytes, bytearray, memoryview)) else payload  # nosec B301
    if not isinstance(value, tuple) or len(value) not in (2, 3):
        raise TypeError(f"payload index {index} is a {type(value).__name__}; expected (count, stats), "
                        "(count, log_likelihood, stats) or pickled bytes of (count, stats)")
    return value


def finish_accumulator(acc: Any) -> Any:
    """mixle's end of a fold: ``key_merge``/``key_replace`` over one dict (tied keys), when the accumulator
    has them; returns ``acc.value()``."""
    if hasattr(acc, "key_merge") and hasattr(acc, "key_replace"):
        stats_dict: dict[str, Any] = {}
        acc.key_merge(stats_dict)
        acc.key_replace(stats_dict)
    return acc.value()


def _sequential_guarded_fold(estimator: Any, payloads: Iterable[Any], where: str,
                             workers_of: Callable[[int], tuple[int, ...]]) -> tuple[float, Any]:
    """mixle 0.8.2's guarded fold: in order into one accumulator, the count before and the value after every
    combine checked; the first non-finite one raises naming ``payload index i`` and no later payload is read."""
    guard = _Guard(where, workers_of)
    acc = estimator.accumulator_factory().make()
    nobs = 0.0
    for i, raw in enumerate(payloads):
        entry = decode_payload(raw, i)
        count, stats = entry[0], entry[-1]
        _raise_at(guard, count, i, f"payload index {i} count", "entry", "count")
        nobs += count
        _raise_at(guard, nobs, i, f"payload index {i}: running observation count", "combine", "nobs")
        acc.combine(stats)
        _raise_at(guard, acc.value(), i, f"payload index {i}, {i + 1} combine() calls so far", "combine", "stats")
    value = finish_accumulator(acc)
    if first_non_finite(value) is not None:
        raise NonFiniteStatisticError(f"{where} (after key_merge/key_replace): {first_non_finite(value)}",
                                      chunks=(-1, -1), workers=(), element=str(first_non_finite(value)),
                                      stage="combine")
    return float(nobs), value


def _raise_at(guard: _Guard, value: Any, index: int, label: str, stage: str, what: str) -> None:
    bad = first_non_finite(value, what)
    if bad is None:
        return
    workers = guard.workers_of(index)
    who = f"; from worker(s) {list(workers)}" if workers else ""
    raise NonFiniteStatisticError(f"{guard.where} ({label}): {bad} is not finite{who}. Check the rows of that "
                                  "payload for NaN/Inf, or the worker's hardware if the same data is finite elsewhere",
                                  chunks=(index, index), workers=workers, element=bad, stage=stage)


def finite_guarded_fold(estimator: Any, payloads: Sequence[Any], where: str = "finite_guarded_fold", *,
                        workers: Mapping[int, Sequence[int]] | Sequence[Any] | None = None) -> tuple[float, Any]:
    """mixle's name: fold per-chunk ``(count, stats)`` or ``(count, log_likelihood, stats)`` payloads,
    checking every one and every combine; returns ``(nobs, stats)``.

    mixle 0.8.2's payloads (pickled ``(count, value)`` bytes, or all 2-tuples) fold as mixle's do, in order
    (``_sequential_guarded_fold``); ours fold in the canonical two-level order with the bits of ``fold_pass``.
    ``where`` prefixes the message.
    """
    workers_of = _workers_lookup(workers)

    if not isinstance(payloads, Sequence):  # an iterable: mixle's order, read lazily
        return _sequential_guarded_fold(estimator, payloads, where, workers_of)
    if any(isinstance(p, (bytes, bytearray, memoryview)) for p in payloads) or (
            payloads and all(is_mixle_payload(p) for p in payloads)):
        return _sequential_guarded_fold(estimator, payloads, where, workers_of)
    total = guarded_fold_pass(estimator, payloads, where=where, workers=workers)
    if not math.isfinite(total.count):  # pragma: no cover - caught at the combine above
        raise FloatingPointError(f"{where}: the total row count is {total.count}")
    return total.count, total.stats
