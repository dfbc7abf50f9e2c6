"""One collective schedule on every SPMD rank (``mpi``, ``torchrun``): each step is checked before it runs.

Every rank of an SPMD job must enter the same collectives in the same order, whichever loop drives the
handle (our ``fit``, mixle's ``optimize`` with ``pysp_seq_log_density_sum`` between E-steps, a
``ModelParallelEstimator``). A rank whose control flow took another branch would otherwise meet its peers
in the wrong collective: the root's payload of one pass handed to another pass's chunk function (a
``TypeError`` deep inside a chunk), or a hang. So before each collective step (a data pass, an all-gather)
every rank numbers it and all-gathers an 8-byte code of its tag -- the step's number, operation, pass and
chunks -- in one fixed-size collective; where the codes differ every rank gathers the tags themselves and
raises the same :class:`CollectiveScheduleError`, naming the step each rank was about to run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CollectiveSchedule", "CollectiveScheduleError", "pass_name"]

PASS_NAMES = {
    "chunk_estep": "E-step",
    "chunk_estep_struck": "E-step (fault injected)",
    "chunk_log_density": "log-density pass",
    "chunk_initialize": "initialization pass",
}
"""The pass a chunk function runs, by the function's name (others are named by their own name)."""


class CollectiveScheduleError(RuntimeError):
    """The ranks of an SPMD job were about to run different collectives; raised on every rank alike."""


def pass_name(fn: Any) -> str:
    """What a pass's chunk function does, in words: ``E-step``, ``log-density pass``, ``audit: group reveal``...

    Wrappers are seen through (``MeteredFn``); a folded E-step and an audit's group reveal say so."""
    inner = getattr(fn, "fn", None)
    kind = type(fn).__name__
    if kind == "MeteredFn" and inner is not None:
        return pass_name(inner)
    if kind == "GroupFold" and inner is not None:
        return f"{pass_name(inner)} (groups folded{', committed' if getattr(fn, 'commit', False) else ''})"
    if kind == "GroupReveal" and inner is not None:
        return f"audit: group reveal of the {pass_name(inner)}"
    name = str(getattr(fn, "__name__", kind))
    return PASS_NAMES.get(name, name)


def _chunks(chunk_ids: Sequence[int] | None) -> str:
    if chunk_ids is None:
        return "every chunk"
    ids = sorted(int(c) for c in chunk_ids)
    shown = ", ".join(str(c) for c in ids[:8]) + (", ..." if len(ids) > 8 else "")
    return f"chunk{'s' if len(ids) != 1 else ''} [{shown}]"


def map_tag(fn: Any, chunk_ids: Sequence[int] | None) -> str:
    """The tag of a data pass: its pass name and the chunks it runs over."""
    return f"map_chunks: {pass_name(fn)} over {_chunks(chunk_ids)}"


class CollectiveSchedule:
    """A rank's numbered collective steps, checked against every other rank's before each one runs.

    ``gather_codes(code)`` is every rank's 64-bit code in rank order (one fixed-size collective);
    ``gather_tags(tag)`` every rank's tag (only where the codes differ, to name them)."""

    def __init__(self, rank: int, gather_codes: Callable[[int], Sequence[int]],
                 gather_tags: Callable[[str], Sequence[str]]) -> None:
        self.rank = rank
        self.steps = 0
        """Collective steps this rank has entered (the next one's number)."""
        self._gather_codes = gather_codes
        self._gather_tags = gather_tags

    def agree(self, operation: str) -> None:
        """Check that every rank is about to run ``operation`` as its next step (a collective: all call it);
        raises :class:`CollectiveScheduleError` on every rank where one differs."""
        tag = f"step {self.steps}: {operation}"
        self.steps += 1
        code = int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "little", signed=True)
        codes = list(self._gather_codes(code))
        if len(set(codes)) <= 1:
            return
        tags = list(self._gather_tags(tag))
        each = "; ".join(f"rank {r}: {t}" for r, t in enumerate(tags))
        raise CollectiveScheduleError(
            f"the ranks of this SPMD job were about to run different collectives ({each}); every rank stops "
            "here with this error. Every rank must drive the handle the same way: the same calls "
            "(estep, pysp_seq_log_density_sum, ...) in the same order with the same arguments; where they do, "
            "a rank's own state steered it off the common schedule, a bug in mixle-parallel: report it with "
            "this message")
