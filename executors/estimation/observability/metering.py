"""Per-worker measurement of every pass, on any chunk runner: the source of ``RankRecord``s.

:class:`MeteredRunner` wraps a runner; each pass function goes out wrapped in a :class:`MeteredFn`,
which times the worker's chunk list *on the worker* (wall and CPU seconds), counts its rows, chunks
and encoded bytes and the size of the statistics it sends back, and returns each entry as a
:class:`Metered` (the value plus, on the first entry of a block, a :class:`WorkMeta`). The wrapper
strips the metadata before anything else sees the results, so statistics, combine order and bits
are untouched. A pass (``begin``/``end``) becomes one :class:`RankRecord` per worker: compute seconds,
wait seconds (the pass's wall time on the driver minus the worker's compute), rows, chunks, bytes.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..em_pass.chunks import ChunkRunner, WorkerTask
from ..em_pass.combine_order import apply_chunk_fn
from ..em_pass.runner_protocols import PoolProcesses, WorkerPlacement, places_work
from ..em_pass.runner_wrapper import ForwardingRunner
from .em_observability import RankRecord

__all__ = ["IN_PROCESS_RUNNERS", "Metered", "MeteredFn", "MeteredRunner", "WorkMeta"]

IN_PROCESS_RUNNERS = frozenset({"local"})
"""Runners whose workers share the driver's memory: nothing crosses a process, so bytes moved are 0."""

_HOST = socket.gethostname()


class WorkMeta(NamedTuple):
    """What one worker measured for one chunk list of one call."""

    worker: str
    pid: int
    seconds: float
    cpu_seconds: float
    rows: int
    chunks: int
    data_bytes: int
    result_bytes: int
    first_chunk: int
    chunk_ids: tuple[int, ...] = ()


class Metered(NamedTuple):
    """A chunk function's entry as it comes back: the value and (first entry of a block) its meta."""

    value: Any
    meta: WorkMeta | None


def _nbytes(value: Any) -> int:
    """Bytes of the numpy arrays in an encoded chunk (tuples, lists and dicts walked)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def _pickled_size(value: Any) -> int:
    try:
        return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - an unpicklable in-process value moves no bytes
        return 0


class MeteredFn(NamedTuple):
    """``fn`` timed on the worker; entries come back as :class:`Metered` (module-level: picklable)."""

    fn: Callable[[Any, Any], Any]

    def __call__(self, chunk: Any, payload: Any) -> Metered:
        """One chunk (runners that call the function per chunk)."""
        return self._measure([int(chunk.chunk_id)], lambda _: chunk, payload)[0]

    def apply_block(self, ids: Sequence[int], chunk_of: Callable[[int], Any], payload: Any) -> list[Metered]:
        """A worker's whole chunk list, through ``apply_chunk_fn`` (so ``GroupFold`` still folds)."""
        return self._measure(list(ids), chunk_of, payload)

    def _measure(self, ids: list[int], chunk_of: Callable[[int], Any], payload: Any) -> list[Metered]:
        cpu0, t0 = time.thread_time(), time.perf_counter()
        values = apply_chunk_fn(self.fn, payload, ids, chunk_of)
        seconds, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        chunks = [chunk_of(i) for i in ids]
        meta = WorkMeta(
            worker=f"{_HOST}:{os.getpid()}:{threading.get_ident()}", pid=os.getpid(), seconds=seconds,
            cpu_seconds=cpu, rows=sum(int(c.stop - c.start) for c in chunks), chunks=len(ids),
            data_bytes=sum(_nbytes(c.data) for c in chunks), result_bytes=_pickled_size(values),
            first_chunk=min(ids) if ids else -1, chunk_ids=tuple(ids),
        )
        return [Metered(v, meta if i == 0 else None) for i, v in enumerate(values)]


class _Tally:
    """One worker's sums over the calls of a pass."""

    __slots__ = ("worker", "seconds", "cpu", "rows", "chunks", "data", "result", "requests")

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.seconds = self.cpu = 0.0
        self.rows = self.chunks = self.data = self.result = self.requests = 0


class MeteredRunner(ForwardingRunner):
    """A chunk runner whose every call is measured per worker; otherwise the wrapped runner itself."""

    inner: ChunkRunner

    def __init__(self, runner: ChunkRunner) -> None:
        self.inner = runner
        self.moves_bytes = runner.name not in IN_PROCESS_RUNNERS
        self._ranks: dict[str, int] = {}
        self._pass: dict[int, _Tally] | None = None
        self._round = 0
        self._kind = ""
        self._wall = 0.0
        self._payload_bytes = 0
        self.chunk_workers: dict[int, list[int]] = {}
        """For the current (or last) pass: chunk id -> the workers that computed it, in the order seen."""

    # -- the runner interface -------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The wrapped runner's backend name."""
        return str(self.inner.name)

    @property
    def num_workers(self) -> int:
        """The wrapped runner's worker count."""
        return int(self.inner.num_workers)

    @property
    def supports_worker_placement(self) -> bool:
        """Whether the wrapped runner can aim chunks at chosen workers."""
        return places_work(self.inner)

    def scatter(self, chunks: Sequence[Any]) -> None:
        """Place the chunks (the wrapped runner's ``scatter``)."""
        self.inner.scatter(chunks)

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """The wrapped ``map_chunks`` of ``fn``, measured; plain results in chunk order."""
        t0 = time.perf_counter()
        out = self.inner.map_chunks(MeteredFn(fn), payload, chunk_ids)  # type: ignore[arg-type]  # NamedTuple __call__
        self._note([(None, out)], time.perf_counter() - t0, payload, fn)
        return [_value(e) for e in out]

    def run_on_workers(self, tasks: dict[int, Any]) -> dict[int, list[Any]]:
        """The wrapped ``run_on_workers``, each task measured on its worker."""
        wrapped = {w: WorkerTask(MeteredFn(t[0]), t[1], tuple(t[2]))  # type: ignore[arg-type]  # NamedTuple __call__
                   for w, t in tasks.items()}
        inner = self.inner
        if not isinstance(inner, WorkerPlacement):
            raise RuntimeError(f"the {inner.name!r} runner cannot compute chosen chunks on a chosen worker")
        t0 = time.perf_counter()
        out = inner.run_on_workers(wrapped)
        first = next(iter(tasks.values()), None)
        self._note([(w, v) for w, v in out.items()], time.perf_counter() - t0,
                   None if first is None else first[1], None if first is None else first[0])
        return {w: [_value(e) for e in v] for w, v in out.items()}

    def compute_on(self, worker: int, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int]) -> list[Any]:
        """``fn`` over ``chunk_ids`` on ``worker``, measured."""
        return self.run_on_workers({worker: WorkerTask(fn, payload, tuple(chunk_ids))})[worker]

    def close(self) -> None:
        """Close the wrapped runner."""
        self.inner.close()

    # -- passes ---------------------------------------------------------------------------------
    def begin(self, round: int, kind: str = "estep") -> None:
        """Start collecting one pass (every call until ``end`` counts towards it)."""
        self._pass, self._round, self._kind, self._wall, self._payload_bytes = {}, int(round), kind, 0.0, 0
        self.chunk_workers = {}

    def end(self) -> list[RankRecord]:
        """The pass's records, one per worker that did work, ordered by rank."""
        tallies, self._pass = self._pass or {}, None
        out = []
        for rank in sorted(tallies):
            t = tallies[rank]
            moved = (t.result + t.requests * self._payload_bytes) if self.moves_bytes else 0
            out.append(RankRecord(
                rank=rank, round=self._round, e_step_seconds=t.seconds, n_obs=t.rows, chunks=t.chunks,
                bytes_processed=t.data, accumulator_bytes=t.result, bytes_moved=moved, worker=t.worker,
                wait_seconds=max(0.0, self._wall - t.seconds),
                extra={"pass": self._kind, "cpu_seconds": t.cpu, "requests": t.requests},
            ))
        return out

    def _note(self, calls: list[tuple[int | None, list[Any]]], wall: float, payload: Any, fn: Any) -> None:
        if self._pass is None:
            return
        self._wall += wall
        if self.moves_bytes and not self._payload_bytes:
            self._payload_bytes = _pickled_size((fn, payload))
        metas = sorted(((w, e.meta) for w, entries in calls for e in entries
                        if isinstance(e, Metered) and e.meta is not None), key=lambda m: m[1].first_chunk)
        for worker, meta in metas:
            rank = self._rank_of(worker, meta)
            t = self._pass.setdefault(rank, _Tally(meta.worker))
            t.seconds += meta.seconds
            t.cpu += meta.cpu_seconds
            t.rows += meta.rows
            t.chunks += meta.chunks
            t.data += meta.data_bytes
            t.result += meta.result_bytes
            t.requests += 1
            for c in meta.chunk_ids:
                self.chunk_workers.setdefault(c, []).append(rank)

    def _rank_of(self, worker: int | None, meta: WorkMeta) -> int:
        """The worker index: given by the call, or the runner's index of the pid, or first-seen order."""
        if worker is not None:
            return int(worker)
        if isinstance(self.inner, PoolProcesses):
            by_pid = dict(zip(self.inner.worker_pids(), self.inner.live_workers))
            if meta.pid in by_pid:
                return int(by_pid[meta.pid])
        return self._ranks.setdefault(meta.worker, len(self._ranks))


def _value(entry: Any) -> Any:
    return entry.value if isinstance(entry, Metered) else entry
