"""One collective schedule on every SPMD rank (``mpi``, ``torchrun``): each step is checked before it runs.

Every rank of an SPMD job must enter the same collectives in the same order, whichever loop drives the
handle (our ``fit``, mixle's ``optimize`` with ``pysp_seq_log_density_sum`` between E-steps, a
``ModelParallelEstimator``). A rank whose control flow took another branch would otherwise meet its peers
in the wrong collective: the root's payload of one pass handed to another pass's chunk function (a
``TypeError`` deep inside a chunk), or a hang. So before each collective step (a data pass, an all-gather)
every rank numbers it and its tag -- the step's number, operation, pass and chunks -- travels in the
step's first collective (no collective is added to a pass): where the tags differ every rank raises the same
:class:`CollectiveScheduleError` before any chunk is computed, naming the step each rank was about to run.
The tags are control traffic, like a barrier: not counted as pass bytes (``wire_bytes``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CollectiveSchedule", "CollectiveScheduleError", "map_tag", "pass_name", "tag_code"]

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


def tag_code(tag: str) -> int:
    """A tag's 64-bit code (signed), for a fixed-size exchange: equal tags, equal codes."""
    return int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "little", signed=True)


class CollectiveSchedule:
    """A rank's numbered collective steps, each checked against every other rank's before it runs.

    The runner exchanges each step's tag (or its :func:`tag_code`) inside the step's first collective, so the
    check adds no collective: ``mpi`` all-gathers the tags with the root's payload, ``torchrun`` all-gathers
    the codes with the payload's size. :meth:`check` raises the same error on every rank where they differ."""

    def __init__(self) -> None:
        self.steps = 0
        """Collective steps this rank has entered (the next one's number)."""

    def next_tag(self, operation: str) -> str:
        """The tag of this rank's next collective step: its number and ``operation``."""
        tag = f"step {self.steps}: {operation}"
        self.steps += 1
        return tag

    def check(self, tags: Sequence[str]) -> None:
        """Every rank's tag of this step, in rank order: raises :class:`CollectiveScheduleError` (the same message
        on every rank) unless they are all equal."""
        if len(set(tags)) <= 1:
            return
        each = "; ".join(f"rank {r}: {t}" for r, t in enumerate(tags))
        raise CollectiveScheduleError(
            f"the ranks of this SPMD job were about to run different collectives ({each}); every rank stops "
            "here with this error. Every rank must drive the handle the same way: the same calls "
            "(estep, pysp_seq_log_density_sum, ...) in the same order with the same arguments; where they do, "
            "a rank's own state steered it off the common schedule, a bug in mixle-parallel: report it with "
            "this message")

    def check_codes(self, tag: str, codes: Sequence[int], gather_tags: Callable[[str], Sequence[str]]) -> None:
        """As :meth:`check`, from every rank's :func:`tag_code`; where they differ the tags themselves are gathered
        (``gather_tags``, a collective every rank then enters) to name them."""
        if len(set(codes)) > 1:
            self.check(list(gather_tags(tag)))
