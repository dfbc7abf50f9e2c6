"""An estimator whose E-step is slow (CPU-bound spinning) in the one worker process that claims a marker.

The statistics are the inner estimator's, untouched. Module-level so spawned mp workers import it.
"""

from __future__ import annotations

import os
import time
from typing import Any


def _mine(marker: str) -> bool:
    """True in the process that renamed the marker first (and from then on)."""
    if os.path.exists(f"{marker}.taken-by-{os.getpid()}"):
        return True
    try:
        os.rename(marker, f"{marker}.taken-by-{os.getpid()}")
        return True
    except FileNotFoundError:
        return False


def spin(seconds: float) -> None:
    """Burn CPU (not sleep) for ``seconds`` of wall time."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


class SlowAccumulator:
    def __init__(self, inner: Any, est: SlowEstimator) -> None:
        self.inner, self.est = inner, est

    def update(self, enc: Any, weights: Any, model: Any) -> Any:
        if _mine(self.est.marker):
            spin(self.est.seconds)
        return self.inner.update(enc, weights, model)

    def initialize(self, enc: Any, weights: Any, rng: Any) -> None:
        self.inner.initialize(enc, weights, rng)

    def combine(self, stats: Any) -> SlowAccumulator:
        self.inner.combine(stats)
        return self

    def value(self) -> Any:
        return self.inner.value()

    def from_value(self, stats: Any) -> SlowAccumulator:
        self.inner.from_value(stats)
        return self


class SlowFactory:
    def __init__(self, est: SlowEstimator) -> None:
        self.est = est

    def make(self) -> SlowAccumulator:
        return SlowAccumulator(self.est.inner.accumulator_factory().make(), self.est)


class SlowEstimator:
    """``inner`` whose E-step spins ``seconds`` per chunk in the process that claims ``marker``."""

    def __init__(self, inner: Any, marker: str, seconds: float) -> None:
        self.inner, self.marker, self.seconds = inner, marker, seconds

    def accumulator_factory(self) -> SlowFactory:
        return SlowFactory(self)

    def estimate(self, nobs: Any, stats: Any) -> Any:
        return self.inner.estimate(nobs, stats)

    def encoder(self) -> Any:
        return self.inner.encoder()


def claimant_pid(marker: str) -> int:
    """The pid of the process that claimed ``marker``."""
    folder, name = os.path.split(marker)
    taken = [f for f in os.listdir(folder or ".") if f.startswith(name + ".taken-by-")]
    if len(taken) != 1:
        raise AssertionError(f"expected one claim of {marker}, found {taken}")
    return int(taken[0].rsplit("-", 1)[1])
