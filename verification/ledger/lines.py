"""Reading a ledger file line by line without ever holding more than one line limit of it.

Iterating a binary file reads a whole line, however long, before anyone can check its size: a ledger
with one 1 GB line and no newline would be held whole. ``bounded_lines`` reads at most the limit (plus
the newline) per line; the rest of an over-long line is skipped in blocks and reported by size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import attrs

__all__ = ["OverlongLine", "bounded_lines"]

_SKIP_BLOCK = 1 << 20


@attrs.frozen
class OverlongLine:
    """A line longer than the limit, skipped unread: its size in bytes and whether it ended with a newline."""

    size: int
    complete: bool

    def problem(self, limit: int) -> str:
        """What a reader reports for it."""
        return (f"a line of {self.size} bytes is over the ledger line limit of {limit} bytes; it was skipped "
                "unread (a ledger line is one JSON entry of at most that size)")


def bounded_lines(handle: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | OverlongLine]]:
    """``(number, line)`` for each line of ``handle`` (1-based); a line over ``limit`` bytes (newline not
    counted) is an :class:`OverlongLine`, never more than ``limit + 1`` bytes of it in memory."""
    readline = handle.readline
    cap = limit + 2  # the limit, its newline, and one byte more to tell an over-long line
    number = 0
    while True:
        data = readline(cap)
        if not data:
            return
        number += 1
        if len(data) < cap:  # a newline or the end of the file came first: at most the limit and one byte
            yield number, data
            continue
        size, complete = len(data), data.endswith(b"\n")
        while not complete:
            rest = readline(_SKIP_BLOCK)
            if not rest:
                break
            size += len(rest)
            complete = rest.endswith(b"\n")
        yield number, OverlongLine(size - complete, complete)
