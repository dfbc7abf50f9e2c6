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


def worker_pid(chunk: Any, payload: Any) -> int:
    """The process id of the worker holding ``chunk``."""
    return os.getpid()
