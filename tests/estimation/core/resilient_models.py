"""Estimators for the resilient-EM tests (module-level so spawned mp workers import them), and the
driver script a test kills and restarts.

``KillOnWorker`` kills the mp worker process named ``mixle-em-mp-<index>`` once per marker file it
claims (``<prefix>0``, ``<prefix>1``, ...), so a restarted worker in the same place dies again.
``SpinEstimator`` burns CPU in every chunk so a pass lasts long enough to kill the driver inside it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from typing import Any

import numpy as np


def _claim(path: str) -> bool:
    try:
        os.rename(path, f"{path}.taken-by-{os.getpid()}")
        return True
    except FileNotFoundError:
        return False


class _Acc:
    def __init__(self, inner: Any, hook: Any) -> None:
        self.inner, self.hook = inner, hook

    def update(self, enc: Any, weights: Any, model: Any) -> Any:
        self.hook()
        return self.inner.update(enc, weights, model)

    def initialize(self, enc: Any, weights: Any, rng: Any) -> None:
        self.inner.initialize(enc, weights, rng)

    def combine(self, stats: Any) -> _Acc:
        self.inner.combine(stats)
        return self

    def value(self) -> Any:
        return self.inner.value()

    def from_value(self, stats: Any) -> _Acc:
        self.inner.from_value(stats)
        return self


class _Factory:
    def __init__(self, est: Any) -> None:
        self.est = est

    def make(self) -> _Acc:
        return _Acc(self.est.inner.accumulator_factory().make(), self.est.hook)


class _Wrapped:
    inner: Any

    def accumulator_factory(self) -> _Factory:
        return _Factory(self)

    def estimate(self, nobs: Any, stats: Any) -> Any:
        return self.inner.estimate(nobs, stats)

    def encoder(self) -> Any:
        return self.inner.encoder()


class KillOnWorker(_Wrapped):
    """Kill worker ``index`` once per claimed marker ``prefix0``, ``prefix1``, ..."""

    def __init__(self, inner: Any, index: int, prefix: str, times: int) -> None:
        self.inner, self.index, self.prefix, self.times = inner, index, prefix, times

    def hook(self) -> None:
        if multiprocessing.current_process().name != f"mixle-em-mp-{self.index}":
            return
        for k in range(self.times):
            if _claim(f"{self.prefix}{k}"):
                os.kill(os.getpid(), signal.SIGKILL)


class SpinEstimator(_Wrapped):
    """Burn ``seconds`` of CPU in every chunk's E-step."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def hook(self) -> None:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


def data() -> np.ndarray:
    rng = np.random.default_rng(5)
    return np.concatenate([rng.normal(-3, 1.0, 3000), rng.normal(3, 1.0, 3000)])


def start_model() -> Any:
    from mixle_parallel import GaussianDistribution, MixtureDistribution

    return MixtureDistribution([GaussianDistribution(-1.0, 4.0), GaussianDistribution(1.0, 4.0)], [0.5, 0.5])


def driver(checkpoint: str, out: str) -> None:
    """The killed-and-restarted driver: a checkpointed fit, its final model's repr written to ``out``."""
    from mixle_parallel import GaussianEstimator, MixtureEstimator
    from mixle_parallel.resilient_em import ResilientMPEncodedData

    est = SpinEstimator(MixtureEstimator([GaussianEstimator()] * 2), 0.05)
    with ResilientMPEncodedData(data(), est, num_workers=2, num_chunks=24, checkpoint=checkpoint,
                                groups_per_batch=2) as h:
        model = h.fit(est, start_model(), max_its=4)
        with open(out, "w") as f:
            f.write(f"{h.resumed_from}\n{model!r}\n")


if __name__ == "__main__":
    driver(sys.argv[1], sys.argv[2])
