"""The mp runner with retries and a blacklist: a dead worker is restarted in its place until it has
failed ``max_retries`` times; then it is blacklisted and its chunks go to the survivors for good.

Any worker can compute any chunk (they all map one shared block), so a restarted worker needs
no data of its own, and the chunks it lost are recomputed on the same bits.

Each round (``begin_round``, one E-step) records which chunks came back from their first worker
(``round_reused``), which were recomputed after their worker died (``round_recomputed``), and which
workers failed or were blacklisted. :meth:`ResilientMPChunkRunner.arm_kill` is mixle 0.8.2's one-shot
fault hook for chaos tests: at the next round every live worker first answers a rendezvous request
(its acknowledgement of the E-step), then ``hook(worker_id, process)`` is called for each before any
chunk work is sent, so a kill there always lands before the worker accumulates anything.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..em_pass.chunks import WorkerLostError, WorkerTimeoutError
from .chunk_assignment import block_assignment as _balanced
from .mp import (
    MPChunkRunner,
)

__all__ = ["KillHook", "ResilientMPChunkRunner"]

KillHook = Callable[[int, Any], None]
"""``hook(worker_id, process)``: called once per live worker at the rendezvous of an armed round."""


def _acknowledge(chunk: Any, payload: Any) -> None:  # pragma: no cover - never called: the request has no chunk ids
    """The rendezvous request's function: a worker answers it with an empty result."""


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
        self._cold = True  # a (re)started worker's first task imports the user's modules
        self._kill_hook: KillHook | None = None
        self._round_hook: KillHook | None = None
        self.round_reused: set[int] = set()
        """Chunks of the current round computed by the worker first sent them."""
        self.round_recomputed: set[int] = set()
        """Chunks of the current round recomputed after their worker died."""
        self.round_failed: set[int] = set()
        """Workers that failed during the current round."""
        self.round_blacklisted: set[int] = set()
        """Workers blacklisted during the current round."""

    # -- rounds and the fault hook -------------------------------------------------------------------
    def arm_kill(self, hook: KillHook | None) -> None:
        """Arm a one-shot ``hook(worker_id, process)`` for the next round (module doc); None disarms it."""
        if hook is not None and not callable(hook):
            raise TypeError(f"arm_kill takes a callable hook(worker_id, process) or None, got {type(hook).__name__}")
        self._kill_hook = hook

    def begin_round(self) -> None:
        """Start a round (one E-step): clear the round's sets and consume an armed kill hook."""
        self.round_reused, self.round_recomputed = set(), set()
        self.round_failed, self.round_blacklisted = set(), set()
        self._round_hook, self._kill_hook = self._kill_hook, None

    def _blocks_by_worker(self) -> dict[int, list[int]]:
        """The chunk ids each current worker (dead or alive) is sent in a plain pass."""
        indices = [w.index for w in self._workers]
        if not indices:
            return {}
        planned = self._blocks if self._blocks is not None and indices == list(range(self.num_workers)) else None
        blocks = planned or [list(b) for b in _balanced(self._num_chunks, len(indices))]
        return dict(zip(indices, blocks))

    def _rendezvous(self, hook: KillHook) -> None:
        """Every live worker acknowledges the round; then ``hook`` sees each one, before any chunk work."""
        request = pickle.dumps(("map", _acknowledge, None, []), protocol=pickle.HIGHEST_PROTOCOL)
        acked = []
        for w in list(self._workers):
            try:
                w.conn.send_bytes(request)
                if not w.conn.poll(self.timeout):
                    raise WorkerTimeoutError(f"mp worker {w.index} did not acknowledge the round")
                w.conn.recv_bytes()
            except (EOFError, OSError, WorkerTimeoutError):
                continue  # dead or hung: _fail_dead below counts it
            acked.append(w)
        for w in acked:
            hook(w.index, w.process)

    def _fail_dead(self, owners: dict[int, list[int]], ids: Sequence[int]) -> None:
        """Count every dead worker as a failure of this round; its planned chunks among ``ids`` are recomputed."""
        wanted = set(ids)
        for w in [w for w in self._workers if not w.process.is_alive()]:
            self._drop(w)
            self._failed(w.index)
            self.round_recomputed.update(wanted.intersection(owners.get(w.index, ())))

    def _start_workers(self, layout: bytes) -> None:
        self._layout_blob = layout
        self._cold = True
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
        self._cold = True

    def _failed(self, index: int) -> None:
        """Count a failure of worker ``index``; restart it or blacklist it."""
        self.failures[index] = self.failures.get(index, 0) + 1
        self.round_failed.add(index)
        if self.failures[index] >= self.max_retries:
            self.blacklist.add(index)
            self.round_blacklisted.add(index)
        else:
            self._restart(index)

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """``fn`` over the chunks; a worker lost meanwhile is restarted or blacklisted and its chunks redone.

        The first task after workers (re)started waits up to ``start_timeout`` (it imports the user's modules,
        e.g. mixle, in each fresh process), the others up to ``timeout``."""
        if self._shm is None:
            raise RuntimeError("map_chunks before scatter(); scatter the chunks first")
        saved = self.timeout
        if self._cold and saved is not None:
            self.timeout = max(saved, self.start_timeout)
        try:
            out = self._map_round(fn, payload, chunk_ids)
        finally:
            self.timeout = saved
        self._cold = False
        return out

    def _map_round(self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None) -> list[Any]:
        """``map_chunks``'s work: the rendezvous of an armed round, dead workers counted, lost chunks redone."""
        ids = list(range(self._num_chunks)) if chunk_ids is None else sorted(int(i) for i in chunk_ids)
        owners = self._blocks_by_worker()
        hook, self._round_hook = self._round_hook, None
        if hook is not None:
            self._rendezvous(hook)
        self._fail_dead(owners, ids)
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
            self.round_recomputed.update(todo)
            if lost:
                time.sleep(0.01)  # let the OS reap the dead process before the next dispatch
        self.round_reused.update(set(ids) - self.round_recomputed)
        return [results[i] for i in ids]
