"""Timeouts of one data pass: the default, the check of a user's value, and a wall-clock deadline."""

from __future__ import annotations

import math
import time

__all__ = ['check_timeout', 'Deadline', 'DEFAULT_TIMEOUT_S']


DEFAULT_TIMEOUT_S = 600.0
"""Seconds a runner waits for one data pass before it declares a worker hung."""


def check_timeout(timeout: float | None) -> float | None:
    """Validate a timeout in seconds (``None`` waits forever)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    return float(timeout)


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
