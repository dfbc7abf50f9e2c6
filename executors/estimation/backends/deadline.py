"""Timeouts of one data pass: the default, the check of a user's value, and a wall-clock deadline."""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable
from typing import TypeVar

WorkerKey = TypeVar("WorkerKey")
"""How a runner names a worker: dask by its address, ray by its actor's position."""

__all__ = ['check_straggler_timeout', 'check_timeout', 'Deadline', 'DEFAULT_TIMEOUT_S', 'StragglerClock',
           'straggler_deadline', 'stragglers_to_give_up']


DEFAULT_TIMEOUT_S = 600.0
"""Seconds a runner waits for one data pass before it declares a worker hung."""


def check_timeout(timeout: float | None) -> float | None:
    """Validate a timeout in seconds (``None`` waits forever)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    return float(timeout)


def check_straggler_timeout(straggler_timeout: float | None, timeout: float | None) -> float | None:
    """Validate ``straggler_timeout=`` (seconds after a pass began at which a worker still silent, while others
    answered, is given up; ``None``: :func:`straggler_deadline`'s rule). It must be below ``timeout``."""
    if straggler_timeout is None:
        return None
    if isinstance(straggler_timeout, bool) or not isinstance(straggler_timeout, (int, float)) \
            or not math.isfinite(straggler_timeout) or straggler_timeout <= 0:
        raise ValueError(f"straggler_timeout must be a positive number of seconds or None (automatic), "
                         f"got {straggler_timeout!r}")
    if timeout is not None and straggler_timeout >= timeout:
        raise ValueError(f"straggler_timeout={straggler_timeout!r} must be below timeout={timeout!r}: the timeout is "
                         "for a pass no worker answers; lower straggler_timeout or raise timeout")
    return float(straggler_timeout)


class Deadline:
    """A wall-clock deadline for one data pass (``None``: no deadline)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        """Seconds left (never negative), or ``None`` without a deadline."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return self._end is not None and time.monotonic() >= self._end


STRAGGLER_MIN_S = 5.0
"""The straggler deadline's floor (seconds): a worker is never given up sooner."""
STRAGGLER_FACTOR = 10.0
"""The straggler deadline in multiples of the pass's first answer."""
STRAGGLER_TIMEOUT_SHARE = 0.25
"""The straggler deadline's ceiling, as a share of the pass's timeout."""


def straggler_deadline(first_answer_s: float, timeout: float | None, fixed: float | None = None) -> float:
    """Seconds after a pass's requests (or its last restart) went out at which a worker still silent, while
    another has answered, is a straggler: ``STRAGGLER_FACTOR`` times the first answer's time, at least
    ``STRAGGLER_MIN_S``, at most ``STRAGGLER_TIMEOUT_SHARE`` of ``timeout`` (well below it: a fit's timeout is for
    when no worker answers).

    A straggler (SIGSTOPped, a hung node) is terminated and its chunks recomputed by the others; a chunk's
    result depends only on the chunk, so the fit ends on the same bits, with one worker fewer. ``fixed`` (the
    ``straggler_timeout=`` option, checked by :func:`check_straggler_timeout`) replaces the rule."""
    if fixed is not None:
        return fixed
    after = max(STRAGGLER_MIN_S, STRAGGLER_FACTOR * first_answer_s)
    return after if timeout is None else min(after, STRAGGLER_TIMEOUT_SHARE * timeout)


class StragglerClock:
    """When the silent workers of one data pass become stragglers (dask, ray and spark; mp keeps its own loop).

    Armed by the pass's first answer at :func:`straggler_deadline` after the pass (or its last restart)
    began; a worker still silent then, while others have answered, is given up and its chunks recomputed
    by the others. ``restart`` whenever chunks are sent again in the pass (after giving up a straggler, or
    re-placing a dead worker's chunks: the recomputation is a new race, not measured against answers that
    came before it), ``disarm`` when no one silent may be given up (a fresh worker's first task waits for
    the pass's timeout)."""

    def __init__(self, timeout: float | None, fixed: float | None = None) -> None:
        self.timeout, self.fixed = timeout, fixed
        self.restart()

    def restart(self) -> None:
        """Start the race again from now, unarmed."""
        self._started = time.monotonic()
        self._due: float | None = None
        self._disarmed = False

    def disarm(self) -> None:
        """No straggler in this race: wait for the pass's own deadline."""
        self._due, self._disarmed = None, True

    def answered(self) -> None:
        """A worker answered: arm the clock (the first answer of the race sets the deadline)."""
        if self._due is None and not self._disarmed:
            now = time.monotonic()
            self._due = self._started + straggler_deadline(now - self._started, self.timeout, self.fixed)

    def expect(self, seconds: float) -> None:
        """Arm the clock as though the race's first answer came after ``seconds`` (a job whose tasks are not
        compared with each other, given the time of the runner's last pass instead)."""
        if not self._disarmed:
            self._due = self._started + straggler_deadline(seconds, self.timeout, self.fixed)

    def due(self) -> bool:
        """Whether the silent workers are stragglers now."""
        return self._due is not None and time.monotonic() >= self._due

    def wait_s(self, remaining: float | None) -> float | None:
        """Seconds to wait for the next answer: up to the straggler deadline, or ``remaining`` (the pass's)."""
        ends = [t for t in (remaining, None if self._due is None else self._due - time.monotonic())
                if t is not None]
        return max(0.0, min(ends)) if ends else None


def stragglers_to_give_up(silent: Iterable[WorkerKey], live: Collection[WorkerKey]) -> list[WorkerKey]:
    """The ``silent`` workers (past the straggler deadline, having answered before) to give up, given the runner's
    ``live`` ones: all of them, or none when no live worker would be left to recompute their chunks (the last
    workers standing are waited for until the pass's ``timeout``, which then names them)."""
    stuck = list(silent)
    return [] if all(w in stuck for w in live) else stuck
