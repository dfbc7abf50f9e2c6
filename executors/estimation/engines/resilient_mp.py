"""The mp runner with retries and a blacklist: a dead worker is restarted in its place until it has
failed ``max_retries`` times; then it is blacklisted and its chunks go to the survivors for good.

Any worker can compute any chunk (they all map one shared block), so a restarted worker needs
no data of its own, and the chunks it lost are recomputed on the same bits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ..chunks import WorkerLostError
from .mp import MPChunkRunner

__all__ = ["ResilientMPChunkRunner"]


class ResilientMPChunkRunner(MPChunkRunner):
    """``MPChunkRunner`` that restarts a dead worker (up to ``max_retries`` failures) before blacklisting it."""

    name = "mp"

    def __init__(self, num_workers: int | None = None, *, max_retries: int = 2, **kwargs: Any) -> None:
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 1:
            raise ValueError(f"max_retries must be an int >= 1 (failures before a worker is blacklisted), "
                             f"got {max_retries!r}")
        super().__init__(num_workers, **kwargs)
        self.max_retries = max_retries
        self.failures: dict[int, int] = {}
        """Failures per worker index so far."""
        self.blacklist: set[int] = set()
        """Workers that failed ``max_retries`` times: never restarted, their chunks run elsewhere."""
        self.restarts: list[int] = []
        """Worker indices restarted, in order."""
        self._layout_blob = b""

    def _start_workers(self, layout: bytes) -> None:
        self._layout_blob = layout
        super()._start_workers(layout)

    def _restart(self, index: int) -> None:
        """Start a fresh process for worker ``index`` on the shared block and wait until it is ready."""
        (worker,) = self._spawn([index], self._layout_blob)
        try:
            self._await_ready(worker, time.monotonic() + self.start_timeout)
        except BaseException:
            worker.process.kill()
            raise
        self._workers.append(worker)
        self._workers.sort(key=lambda w: w.index)
        self.restarts.append(index)

    def _failed(self, index: int) -> None:
        """Count a failure of worker ``index``; restart it or blacklist it."""
        self.failures[index] = self.failures.get(index, 0) + 1
        if self.failures[index] >= self.max_retries:
            self.blacklist.add(index)
        else:
            self._restart(index)

    def _heal(self) -> None:
        """Workers found dead between passes count as failures too."""
        for w in [w for w in self._workers if not w.process.is_alive()]:
            self._drop(w)
            self._failed(w.index)

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """``fn`` over the chunks; a worker lost meanwhile is restarted or blacklisted and its chunks redone."""
        if self._shm is None:
            raise RuntimeError("map_chunks before scatter(); scatter the chunks first")
        self._heal()
        ids = list(range(self._num_chunks)) if chunk_ids is None else sorted(int(i) for i in chunk_ids)
        results: dict[int, Any] = {}
        todo = list(ids)
        while todo:
            if not self._workers:
                raise WorkerLostError(f"every mp worker is blacklisted ({sorted(self.blacklist)}); chunks {todo} "
                                      "cannot be computed. Check the machine and start a new handle")
            self._dispatch(fn, payload, todo)
            lost = self._collect(lambda w, cid, value: results.__setitem__(cid, value))
            for index, _ in lost:
                self._failed(index)
            todo = sorted(c for _, cids in lost for c in cids)
            if lost:
                time.sleep(0.01)  # let the OS reap the dead process before the next dispatch
        return [results[i] for i in ids]
