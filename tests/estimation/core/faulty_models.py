"""Estimators that kill or hang the worker process that claims a marker file (fault-injection tests).

Only a worker claims it: the process that built the estimator (the driver, whose SDC audit E-steps audited
chunks with the same estimator for its reference) never does, or the test would kill itself.

The wrapped statistics are the inner estimator's, untouched, so a recovered fit must end on the
same bits as an uninterrupted one. Module-level so spawned mp workers can import it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def _claim(marker: str) -> bool:
    try:
        os.rename(marker, marker + f".taken-by-{os.getpid()}")
        return True
    except FileNotFoundError:
        return False


class FaultyAccumulator:
    def __init__(self, inner: Any, marker: str, mode: str, driver_pid: int) -> None:
        self.inner, self.marker, self.mode, self.driver_pid = inner, marker, mode, driver_pid

    def update(self, enc: Any, weights: Any, model: Any) -> Any:
        if os.getpid() != self.driver_pid and _claim(self.marker):
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # hang
        return self.inner.update(enc, weights, model)

    def initialize(self, enc: Any, weights: Any, rng: Any) -> None:
        self.inner.initialize(enc, weights, rng)

    def combine(self, stats: Any) -> FaultyAccumulator:
        self.inner.combine(stats)
        return self

    def value(self) -> Any:
        return self.inner.value()

    def from_value(self, stats: Any) -> FaultyAccumulator:
        self.inner.from_value(stats)
        return self


class FaultyFactory:
    def __init__(self, est: FaultyEstimator) -> None:
        self.est = est

    def make(self) -> FaultyAccumulator:
        est = self.est
        return FaultyAccumulator(est.inner.accumulator_factory().make(), est.marker, est.mode, est.driver_pid)


class FaultyEstimator:
    """``inner`` whose E-step kills (mode='kill') or hangs (mode='hang') the claiming process."""

    def __init__(self, inner: Any, marker: str, mode: str = "kill") -> None:
        self.inner, self.marker, self.mode = inner, marker, mode
        self.driver_pid = os.getpid()  # pickled to the workers: they claim, this process never does

    def accumulator_factory(self) -> FaultyFactory:
        return FaultyFactory(self)

    def estimate(self, nobs: Any, stats: Any) -> Any:
        return self.inner.estimate(nobs, stats)

    def encoder(self) -> Any:
        return self.inner.encoder()
