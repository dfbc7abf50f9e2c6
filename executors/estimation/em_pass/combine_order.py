"""The canonical combine order of a pass's chunk statistics, and folding it on the workers.

Statistics are combined in two fixed levels: chunks in order within contiguous groups
(:func:`combine_groups`, a function of the chunk count only), then the groups in order. Every
backend and worker count therefore adds the same numbers in the same order. A worker that holds
a whole group may fold it itself (:class:`GroupFold` through :func:`apply_chunk_fn`), so one small
result per group travels back instead of one per chunk; the driver folds what came back per chunk
with the very same function (:func:`fold_pass`), so where a group was folded never shows in the bits.
"""

from __future__ import annotations

import hashlib
import io
import pickle  # nosec B403 - bytes hashed here, never loaded
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_CHUNK_MULTIPLE", "GroupFold", "GroupReveal", "GroupStats", "SealedResult", "UnreadableOwnResult",
    "apply_chunk_fn", "chunk_result", "combine_groups", "commit_digest", "committed_result", "fold_group", "fold_pass",
    "group_of", "opened", "own_result",
]

DEFAULT_CHUNK_MULTIPLE = 12
"""With default chunking, a chunk count above one is rounded up to a multiple of this, so the
contiguous blocks of chunks split evenly over 1, 2, 3, 4 or 6 workers (13 chunks on 2 workers
left one worker 7/6 busier than the other). It depends on the row count only, never on workers.
It is also the most combine groups a pass has."""


class GroupStats(NamedTuple):
    """E-step results of a run of chunks folded in chunk order: rows, log-likelihood, statistics;
    ``last`` is the group's last chunk's own result when it was asked for (an audited chunk)."""

    count: float  # type: ignore[assignment]  # a NamedTuple field may shadow tuple.count; mypy reads it as an override
    log_likelihood: float
    stats: Any
    last: Any = None
    digests: tuple[str, ...] = ()
    """:func:`commit_digest` of each of the group's chunks' own results, in order, where the pass committed to
    them (``GroupFold(commit=True)``)."""


def _group_size(num_chunks: int) -> int:
    return max(1, -(-int(num_chunks) // DEFAULT_CHUNK_MULTIPLE))


def combine_groups(num_chunks: int) -> tuple[tuple[int, int], ...]:
    """The chunk ranges ``[a, b)`` whose E-step results are folded first; the groups are then folded in order.

    A function of the chunk count only (at most ``DEFAULT_CHUNK_MULTIPLE`` groups of equal size), so
    the order, and with it every bit of the sums, is the same on every backend and worker count;
    with default chunking the groups line up with the blocks of 1, 2, 3, 4 or 6 workers.
    """
    n = int(num_chunks)
    return tuple((a, min(a + _group_size(n), n)) for a in range(0, n, _group_size(n))) if n > 0 else ()


def fold_group(estimator: Any, results: Sequence[Any]) -> GroupStats:
    """Fold ``(count, log_likelihood, stats)`` results strictly in the given order (one is kept as is)."""
    if len(results) == 1:
        return GroupStats(float(results[0][0]), float(results[0][1]), results[0][2])
    acc = estimator.accumulator_factory().make()
    count = ll = 0.0
    for r in results:
        count += float(r[0])
        ll += float(r[1])
        acc.combine(r[2])
    return GroupStats(count, ll, acc.value())


def fold_pass(estimator: Any, results: Sequence[Any]) -> GroupStats:
    """One pass's total from per-chunk entries in chunk order, in the canonical two-level order.

    An entry is a chunk's ``ChunkResult``, or -- for a group folded on a worker -- the group's
    ``GroupStats`` at its last chunk and ``None`` at the others (or their own results, where asked
    for: they are then for the audit only).
    """
    parts = []
    for a, b in combine_groups(len(results)):
        entries = results[a:b]
        last = entries[-1]
        if isinstance(last, GroupStats) and not any(isinstance(e, GroupStats) for e in entries[:-1]):
            parts.append(last)
        elif all(e is not None and not isinstance(e, GroupStats) for e in entries):
            parts.append(fold_group(estimator, entries))
        else:
            raise RuntimeError(
                f"chunks {a}..{b - 1} came back partly folded; a runner must return a group either folded "
                "(None, ..., GroupStats) or per chunk. This is a bug in the runner"
            )
    if not parts:
        return GroupStats(0.0, 0.0, estimator.accumulator_factory().make().value())
    return fold_group(estimator, parts)


class GroupFold(NamedTuple):
    """A pass's chunk function ``fn`` (returning ``(count, log_likelihood, stats)``, its payload's first
    item the estimator) whose results are folded on the worker: through :func:`apply_chunk_fn`, each
    combine group that lies wholly in a worker's chunk list comes back as one :class:`GroupStats`.
    The ``raw`` chunks (the audited ones) also bring back their own results (see :func:`chunk_result`);
    with ``commit`` every folded group brings back the digests of its chunks' own results instead, so the
    task names no chunk and the audit picks one after the results are in (:func:`committed_result`). With a
    ``retain`` token (``"<owner>:<pass>"``) the worker also keeps its folded groups' own results until the
    owner's next pass, for a :class:`GroupReveal` to hand back (the audit opens a group after the pass). With
    ``seal`` (and ``commit``) the own results of a folded group's ``raw`` chunks come back as the very bytes their
    digests are of (:class:`SealedResult`): pickled once on the worker, opened by the driver only where it must."""

    fn: Callable[[Any, Any], Any]
    num_chunks: int
    raw: frozenset[int] = frozenset()
    commit: bool = False
    retain: str = ""
    seal: bool = False

    def __call__(self, chunk: Any, payload: Any) -> Any:
        """One chunk, not folded (what a runner that does not use ``apply_chunk_fn`` gets)."""
        return self.fn(chunk, payload)

    def apply_block(self, ids: Sequence[int], chunk_of: Callable[[int], Any], payload: Any) -> list[Any]:
        """Entries for ``ids`` (in that order): complete groups folded (with the own results of their
        ``raw`` chunks), every other chunk per chunk."""
        ids = list(ids)
        out: list[Any] = []
        i = 0
        while i < len(ids):
            c = ids[i]
            a, b = group_of(self.num_chunks, c)
            if b - a > 1 and c == a and ids[i:i + b - a] == list(range(a, b)):
                results = [_call(self.fn, payload, j, chunk_of) for j in range(a, b)]
                if self.retain:
                    _retain(self.retain, a, results)
                own = [SealedResult.of(r) if self.seal and self.commit and j in self.raw else r
                       for j, r in zip(range(a, b), results)]
                out.extend(own[j - a] if j in self.raw else None for j in range(a, b - 1))
                out.append(fold_group(payload[0], results)._replace(
                    last=own[-1] if b - 1 in self.raw else None,
                    digests=tuple(commit_digest(r) for r in own) if self.commit else ()))
                i += b - a
            else:
                out.append(_call(self.fn, payload, c, chunk_of))
                i += 1
        return out


_RETAINED: dict[str, tuple[str, dict[int, Any]]] = {}
"""In a worker process: per owner (a handle's audit), its latest pass token and the own results of the chunks
of the groups it folded in that pass, by chunk id (a worker keeps one pass per owner)."""
_RETAINED_OWNERS = 8
"""The most owners a worker process keeps a pass for (handles sharing an in-process runner); the oldest goes."""
_RETAINED_LOCK = threading.Lock()


def _retain(token: str, first: int, results: Sequence[Any]) -> None:
    """Keep a folded group's own results under ``token``; a new pass of the same owner drops the last one."""
    owner = token.split(":", 1)[0]
    with _RETAINED_LOCK:
        held = _RETAINED.get(owner)
        if held is None or held[0] != token:
            _RETAINED.pop(owner, None)
            while len(_RETAINED) >= _RETAINED_OWNERS:
                _RETAINED.pop(next(iter(_RETAINED)))
            held = _RETAINED[owner] = (token, {})
        held[1].update(zip(range(first, first + len(results)), results))


def _retained(token: str, chunk: int) -> tuple[bool, Any]:
    """(found, chunk ``chunk``'s own result retained under ``token`` in this process)."""
    with _RETAINED_LOCK:
        held = _RETAINED.get(token.split(":", 1)[0])
        if held is None or held[0] != token or chunk not in held[1]:
            return False, None
        return True, held[1][chunk]


class GroupReveal(NamedTuple):
    """A follow-up task on the worker that folded a pass with ``GroupFold(retain=token)``: the own results of
    the chunks asked for, as that pass computed them (kept in the worker). A chunk this process did not keep
    (another process got the task, or the owner ran a newer pass) is computed again with ``fn``; either way
    the audit checks each value against the digest the pass committed to."""

    fn: Callable[[Any, Any], Any]
    token: str

    def __call__(self, chunk: Any, payload: Any) -> Any:
        """One chunk computed again (what a runner that does not use ``apply_chunk_fn`` gets)."""
        return self.fn(chunk, payload)

    def apply_block(self, ids: Sequence[int], chunk_of: Callable[[int], Any], payload: Any) -> list[Any]:
        """The retained own result of each of ``ids`` (in that order), computed again where none is kept."""
        out = []
        for c in ids:
            found, value = _retained(self.token, c)
            out.append(value if found else _call(self.fn, payload, c, chunk_of))
        return out


def chunk_result(entries: Sequence[Any], chunk: int) -> Any:
    """Chunk ``chunk``'s own result among a pass's entries (it must have been asked for, as ``raw``)."""
    entry = entries[chunk]
    if isinstance(entry, GroupStats):
        entry = entry.last
    if entry is None:
        raise KeyError(f"chunk {chunk}'s own result did not come back: pass it in GroupFold(raw=...)")
    return opened(entry, chunk)


def _commit_bytes(result: Any) -> bytes:
    """The bytes a commitment digests: ``result`` pickled without memo, protocol 4 (see :func:`commit_digest`)."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=4)
    pickler.fast = True  # no memo: the bytes do not depend on object identity
    pickler.dump(result)
    return buffer.getvalue()


def commit_digest(result: Any) -> str:
    """``sha256:<hex>`` of one chunk's E-step result as pickled: what a worker commits to for each chunk of a
    folded group, cheap enough for every chunk of every pass. Equal digests mean equal bits (floats and arrays
    pickle exactly); differing ones are settled by a replay. A :class:`SealedResult` is digested as it stands.

    The pickle is a function of the value alone: no memo (``Pickler.fast``), so which objects happen to be shared
    (the one ``dtype`` behind a numpy scalar and an array) leaves no ``BINGET`` in the bytes, and protocol 4, so
    an array is written the same whether it is contiguous or a view. A result and its copy that crossed a
    transport therefore digest alike: on SPMD backends the rank that computed a chunk and the ranks that
    received it reach the same verdict, and enter the same collectives (a plain ``pickle.dumps`` of mixle's
    statistics differed between the two, and the ranks fell out of step)."""
    data = result.data if isinstance(result, SealedResult) else _commit_bytes(result)
    return "sha256:" + hashlib.sha256(data).hexdigest()


class UnreadableOwnResult(ValueError):
    """A sealed own result whose bytes are not a pickled chunk result (the worker that sent it is at fault)."""

    def __init__(self, chunk: int, problem: str) -> None:
        super().__init__(f"chunk {chunk}'s sealed own result does not unpickle to a chunk result: {problem}")
        self.chunk = chunk


class SealedResult:
    """One chunk's own result as the bytes its commitment digests (``_commit_bytes``), shipped beside its folded
    group's sum: the worker pickles it once for digest and transport alike, and the driver hashes the bytes and
    opens (unpickles) only the chunks of the groups the audit opens. Unpickling is no new trust: every runner's
    transport already unpickles what its workers send."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[type[SealedResult], tuple[bytes]]:
        return SealedResult, (self.data,)

    def __repr__(self) -> str:
        return f"SealedResult(<{len(self.data) if self.holds_bytes else '?'} bytes>)"

    @property
    def holds_bytes(self) -> bool:
        """Whether the seal holds bytes at all (one from a worker may hold anything)."""
        return isinstance(self.data, bytes)

    @classmethod
    def of(cls, result: Any) -> SealedResult:
        """``result`` sealed."""
        return cls(_commit_bytes(result))

    def open(self, chunk: int) -> Any:
        """The result sealed in, a ``(count, log_likelihood, stats)`` tuple; :class:`UnreadableOwnResult` (naming
        ``chunk``) where the bytes are not one."""
        if not self.holds_bytes:
            raise UnreadableOwnResult(chunk, f"it holds a {type(self.data).__name__}, not bytes")
        try:
            value = pickle.loads(self.data)  # nosec B301 - a worker's own result, as the transport already unpickles
        except Exception as exc:  # noqa: BLE001 - any unpickling failure is the sender's defect
            raise UnreadableOwnResult(chunk, f"{type(exc).__name__}: {exc}") from None
        if not (isinstance(value, tuple) and len(value) == 3):
            raise UnreadableOwnResult(chunk, f"it holds a {type(value).__name__}, not a chunk's (count, "
                                             "log_likelihood, stats)")
        return value


def opened(value: Any, chunk: int) -> Any:
    """``value`` itself, or the result inside a :class:`SealedResult` (chunk ``chunk``'s, for the error)."""
    return value.open(chunk) if isinstance(value, SealedResult) else value


def own_result(entries: Sequence[Any], chunk: int) -> Any:
    """Chunk ``chunk``'s own result among a pass's entries as it came back (a :class:`SealedResult` where it was
    sealed: read it with :func:`opened`), or None where it did not (only its digest, in a group folded with
    ``GroupFold(commit=True)``)."""
    entry = entries[chunk]
    if entry is not None and not isinstance(entry, GroupStats):
        return entry
    _, b = group_of(len(entries), chunk)
    group = entries[b - 1]
    return group.last if chunk == b - 1 and isinstance(group, GroupStats) else None


def committed_result(entries: Sequence[Any], chunk: int) -> tuple[Any, str]:
    """Chunk ``chunk``'s own result among a pass's entries, or None where only its digest came back (a group
    folded with ``GroupFold(commit=True)``), and the :func:`commit_digest` the pass committed to for it (an own
    result that came back, a ``raw`` chunk's, is preferred: the peer replays compare it)."""
    own = own_result(entries, chunk)
    if own is not None:
        return opened(own, chunk), commit_digest(own)
    a, b = group_of(len(entries), chunk)
    group = entries[b - 1]
    if isinstance(group, GroupStats) and len(group.digests) == b - a:
        return None, group.digests[chunk - a]
    own = chunk_result(entries, chunk)  # raises, naming the chunk whose result did not come back
    return own, commit_digest(own)


def group_of(num_chunks: int, chunk: int) -> tuple[int, int]:
    """The combine group ``[a, b)`` that holds ``chunk``."""
    size = _group_size(num_chunks)
    a = chunk - chunk % size
    return a, min(a + size, int(num_chunks))


def apply_chunk_fn(fn: Callable[[Any, Any], Any], payload: Any, ids: Sequence[int],
                   chunk_of: Callable[[int], Any]) -> list[Any]:
    """What a worker computes for its chunk list: ``fn(chunk, payload)`` per id, or, when ``fn`` has an
    ``apply_block`` (e.g. :class:`GroupFold`), its entries for the whole list. Runners call this
    for every chunk list a worker evaluates; an exception carries the failing ``chunk_id``."""
    block = getattr(fn, "apply_block", None)
    if block is not None:
        return block(ids, chunk_of, payload)
    return [_call(fn, payload, i, chunk_of) for i in ids]


def _call(fn: Callable[[Any, Any], Any], payload: Any, chunk: int, chunk_of: Callable[[int], Any]) -> Any:
    """``fn`` on one chunk; an exception leaves tagged with the ``chunk_id`` it was raised on."""
    try:
        return fn(chunk_of(chunk), payload)
    except BaseException as exc:
        if not hasattr(exc, "chunk_id"):
            exc.chunk_id = chunk  # type: ignore[attr-defined]
        raise
