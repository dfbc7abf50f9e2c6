"""The shape of a pass's commitments, checked before anything is drawn or folded.

Every combine group of an audited pass comes back either per chunk (each chunk's own result) or folded: one
``GroupStats`` at the group's last chunk carrying a ``commit_digest`` per chunk (``GroupFold(commit=True)``).
A group that comes back otherwise (digests missing, short, not digests; a hole where a result belongs; sealed
own results, ``SealedResult``, holding no bytes or beside no folded sum) gives the audit nothing to bind its sum
to, so the pass is refused as a backend defect naming the group and its worker, before the sample is drawn. A
sealed own result that does not unpickle when its group is opened is refused the same way
(:func:`unreadable_own_result`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ....verification.sdc.schedule import BackendDefectError
from ..em_pass.combine_order import GroupStats, SealedResult, UnreadableOwnResult, combine_groups, group_of

__all__ = ["MalformedCommitmentError", "check_commitments", "unreadable_own_result"]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class MalformedCommitmentError(BackendDefectError):
    """A group of a pass came back without a well-formed commitment per chunk (a backend defect)."""

    def __init__(self, backend: str, iteration: int, group: tuple[int, int], worker: int | None, problem: str) -> None:
        super().__init__(())
        self.group, self.worker, self.iteration = group, worker, iteration
        where = f"group of chunks {group[0]}..{group[1] - 1}" + ("" if worker is None else f" (worker {worker})")
        self.args = (f"backend defect: the {backend} backend returned the {where} of pass {iteration} {problem}; "
                     "every folded group must carry one commit_digest per chunk (GroupFold(commit=True)) and every "
                     "other chunk its own result. Fix the runner (or run on a built-in backend)",)


def _problem(entries: Sequence[Any], a: int, b: int) -> str | None:
    """What is wrong with group ``[a, b)``'s entries, or None when it is committed or per chunk."""
    group, last = entries[a:b], entries[b - 1]
    if all(e is not None and not isinstance(e, GroupStats) for e in group):
        sealed = [a + i for i, e in enumerate(group) if isinstance(e, SealedResult)]
        return f"per chunk with sealed own results for chunk(s) {sealed} and no folded sum" if sealed else None
    if not isinstance(last, GroupStats):
        return "with a chunk missing and no folded sum"
    if any(isinstance(e, GroupStats) for e in group[:-1]):
        return "folded more than once"
    digests = last.digests
    if not isinstance(digests, tuple) or len(digests) != b - a:
        count = len(digests) if isinstance(digests, (tuple, list)) else 0
        return f"folded with {count} commitment(s) for its {b - a} chunks"
    bad = [a + i for i, d in enumerate(digests) if not (isinstance(d, str) and _DIGEST.fullmatch(d))]
    if bad:
        return f"with malformed commitments for chunk(s) {bad}"
    own = [*group[:-1], last.last]
    unsealed = [a + i for i, e in enumerate(own) if isinstance(e, SealedResult) and not e.holds_bytes]
    if unsealed:
        return f"with sealed own results that hold no bytes for chunk(s) {unsealed}"
    return None


def check_commitments(entries: Sequence[Any], num_chunks: int, *, backend: str, iteration: int,
                      owners: Sequence[int] = ()) -> None:
    """Refuse (``MalformedCommitmentError``) a pass whose entries do not commit to every chunk (module doc)."""
    if len(entries) != num_chunks:
        raise MalformedCommitmentError(backend, iteration, (0, num_chunks), None,
                                       f"as {len(entries)} entries for {num_chunks} chunks")
    for a, b in combine_groups(num_chunks):
        problem = _problem(entries, a, b)
        if problem is not None:
            raise MalformedCommitmentError(backend, iteration, (a, b), _worker(owners, b, num_chunks), problem)


def unreadable_own_result(error: UnreadableOwnResult, num_chunks: int, *, backend: str, iteration: int,
                          owners: Sequence[int] = ()) -> MalformedCommitmentError:
    """The backend defect for a sealed own result that does not unpickle, naming its group and worker."""
    a, b = group_of(num_chunks, error.chunk)
    return MalformedCommitmentError(backend, iteration, (a, b), _worker(owners, b, num_chunks), f"with {error}")


def _worker(owners: Sequence[int], end: int, num_chunks: int) -> int | None:
    """The worker that folded the group ending before ``end`` (None where the owners are not known)."""
    return int(owners[end - 1]) if len(owners) == num_chunks else None
