"""A robust rolling baseline: median and scaled MAD of a trailing window, scored before it is updated."""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

MAD_TO_STD = 1.4826  # the MAD of a normal sample times this estimates its standard deviation
_MIN_SPREAD = 1e-12


class RollingBaseline:
    """Median and scaled MAD over the last ``window`` values; ``z_score`` judges a value against the window
    as it was before the value (update after scoring, so a point never sits in its own baseline)."""

    def __init__(self, window: int = 20, min_periods: int = 5) -> None:
        for name, value in (("window", window), ("min_periods", min_periods)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an int >= 2, got {value!r}")
        if min_periods > window:
            raise ValueError(f"min_periods={min_periods} must not exceed window={window}")
        self.window, self.min_periods = window, min_periods
        self._values: deque[float] = deque(maxlen=window)
        self._cached: tuple[float, float] | None = None

    def __len__(self) -> int:
        return len(self._values)

    def baseline(self) -> tuple[float, float] | None:
        """``(median, scaled MAD)`` of the window, or None while it holds fewer than ``min_periods`` values."""
        if len(self._values) < self.min_periods:
            return None
        if self._cached is None:  # scoring asks several times per step; a window is a few dozen floats
            med = statistics.median(self._values)
            self._cached = med, statistics.median([abs(v - med) for v in self._values]) * MAD_TO_STD
        return self._cached

    def z_score(self, value: float) -> float | None:
        """The robust z-score of ``value`` against the current window; None during warm-up."""
        b = self.baseline()
        if b is None:
            return None
        med, mad = b
        return (float(value) - med) / max(mad, _MIN_SPREAD)

    def update(self, value: float) -> None:
        """Add a finite value (the oldest falls out of a full window)."""
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"a baseline takes finite values only, got {value}")
        self._values.append(value)
        self._cached = None

    def state(self) -> dict[str, Any]:
        """A JSON-ready snapshot to carry across a checkpoint (restart continuity)."""
        return {"window": self.window, "min_periods": self.min_periods, "values": list(self._values)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RollingBaseline:
        """Inverse of ``state``."""
        obj = cls(window=state["window"], min_periods=state["min_periods"])
        if len(state["values"]) > obj.window:
            raise ValueError(f"baseline state holds {len(state['values'])} values, more than its window {obj.window}")
        for v in state["values"]:
            obj.update(v)
        return obj
