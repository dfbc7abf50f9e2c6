"""Chunk functions for the engine tests; pickled by value so engine workers need not import tests/."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np


def claim(marker: str) -> bool:
    """True exactly once per marker path (atomic create), across processes."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def make_chunks(num_chunks: int, rows: int = 50, seed: int = 7) -> list[tuple[int, np.ndarray]]:
    """``(chunk id, float64 array)`` chunks with awkward values so summation order matters."""
    rng = np.random.default_rng(seed)
    return [(i, rng.standard_normal(rows) * 10.0 ** rng.integers(-8, 8, rows)) for i in range(num_chunks)]


def expected(chunks: list[tuple[int, np.ndarray]], scale: float = 1.0) -> list[tuple[int, float]]:
    """What ``probe`` returns for each chunk, computed in this process."""
    return [(cid, float(np.sum(arr)) * scale) for cid, arr in chunks]


def probe(chunk: tuple[int, np.ndarray], payload: dict[str, Any]) -> tuple[int, float]:
    """Sum a chunk; on request kill this worker (once), hang until released, or raise."""
    cid, arr = chunk
    if payload.get("kill_chunk") == cid and claim(payload["marker"]):
        os.kill(os.getpid(), signal.SIGKILL)
    if payload.get("hang_chunk") == cid:
        end = time.monotonic() + payload.get("hang_s", 120.0)
        while not os.path.exists(payload["release"]) and time.monotonic() < end:
            time.sleep(0.05)
    if payload.get("fail_chunk") == cid:
        raise ValueError(f"chunk {cid} is bad on purpose")
    return cid, float(np.sum(arr)) * payload.get("scale", 1.0)


def thread_name(chunk: Any, payload: Any) -> str:
    """Name of the thread that computed the chunk (a direct pass channel's is "mixle-em-channel")."""
    import threading

    return threading.current_thread().name


def worker_pid(chunk: Any, payload: Any) -> int:
    """The process id of the worker holding ``chunk``."""
    return os.getpid()


class _SabotageFactory:
    def __init__(self, owner: SabotageEstimator) -> None:
        self.owner = owner

    def make(self) -> _SabotageAccumulator:
        return _SabotageAccumulator(self.owner, self.owner.inner.accumulator_factory().make())


class _SabotageAccumulator:
    """Delegates to the wrapped accumulator; once armed, its E-step kills or stalls its worker."""

    def __init__(self, owner: SabotageEstimator, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    def initialize(self, enc: Any, weights: Any, rng: Any) -> None:
        self.inner.initialize(enc, weights, rng)

    def update(self, enc: Any, weights: Any, model: Any) -> Any:
        o = self.owner
        if os.getpid() != o.driver_pid and os.path.exists(o.arm) and claim(o.marker):
            if o.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if o.action == "stop":
                with open(o.marker, "w") as marker:
                    marker.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)
                return self.inner.update(enc, weights, model)
            end = time.monotonic() + 120.0
            while not os.path.exists(o.release) and time.monotonic() < end:
                time.sleep(0.05)
        return self.inner.update(enc, weights, model)

    def combine(self, stats: Any) -> _SabotageAccumulator:
        self.inner.combine(stats)
        return self

    def value(self) -> Any:
        return self.inner.value()

    def from_value(self, stats: Any) -> _SabotageAccumulator:
        self.inner.from_value(stats)
        return self


class SabotageEstimator:
    """Wraps an estimator; after the ``arm`` file appears, the first remote E-step of a chunk
    kills its worker process (``action='kill'``), hangs it until ``release`` exists ('hang'), or
    SIGSTOPs it ('stop': alive and silent; its pid is written to the ``fired`` marker for a SIGCONT).
    The statistics are the wrapped estimator's, so a recovered fit has the plain fit's bits."""

    def __init__(self, inner: Any, workdir: str, action: str = "kill") -> None:
        self.inner, self.action = inner, action
        self.arm = os.path.join(workdir, "arm")
        self.marker = os.path.join(workdir, "fired")
        self.release = os.path.join(workdir, "release")
        self.driver_pid = os.getpid()

    def accumulator_factory(self) -> _SabotageFactory:
        return _SabotageFactory(self)

    def estimate(self, nobs: Any, stats: Any) -> Any:
        return self.inner.estimate(nobs, stats)

    def encoder(self) -> Any:
        return self.inner.encoder()

    def arm_at(self, iteration: int) -> Any:
        """An ``on_step`` callback that arms the sabotage after pass ``iteration``."""

        def on_step(step: Any) -> None:
            if step.iteration == iteration:
                open(self.arm, "w").close()

        return on_step


def page_faults_per_pass(chunk: Any, payload: dict[str, Any]) -> float:
    """Minor page faults per repeated numpy pass over a chunk-sized temporary, in this worker."""
    import resource

    x = np.ones((payload.get("rows", 16384), 16))

    def one_pass() -> float:
        a = x * 2.0
        b = np.concatenate([a, a], axis=1)
        return float((b @ b[:16].T).sum())

    for _ in range(3):
        one_pass()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(payload.get("passes", 20)):
        one_pass()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / payload.get("passes", 20)


WIRE_PAYLOAD = {"scale": 2.0, "pad": np.arange(4096, dtype=np.float64)}
"""A pass payload of ~32 KiB, so the pickled payload dominates a request's bytes."""


def wide(chunk: tuple[int, np.ndarray], payload: dict[str, Any]) -> np.ndarray:
    """A 4 KiB result per chunk (the chunk's sum, scaled, repeated), so statistics dominate a reply's bytes."""
    cid, arr = chunk
    return np.full(512, float(np.sum(arr)) * payload["scale"])


def dies_then_slow(chunk: tuple[int, np.ndarray], payload: dict[str, Any]) -> float:
    """The chunk's sum; the worker process ``payload["victim"]`` dies at its first chunk, and the chunks it held
    (``payload["slow"]``) take ``payload["sleep"]`` seconds each wherever they are recomputed."""
    cid, arr = chunk
    if os.getpid() == payload["victim"]:
        os.kill(os.getpid(), signal.SIGKILL)
    if cid in payload["slow"]:
        time.sleep(payload["sleep"])
    return float(np.sum(arr))


def dying_once(marker: str, fn: Any) -> Any:
    """``fn``, except that the first call (one per ``marker``, across processes) SIGKILLs its own process."""
    def call(*args: Any) -> Any:
        if claim(marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args)

    return call
