"""The ``mp`` backend: worker processes reading encoded chunks from one shared-memory block.

Every numpy array of the encoded chunks is copied once into a ``SharedMemory`` segment; workers
attach and build zero-copy views, so any worker can compute any chunk. That is what makes fault
recovery simple: a dead worker's chunks are re-sent to the survivors, and since a chunk's result
depends only on the chunk (BLAS capped to one thread per worker), the fit ends on the same bits.
A worker that the others outrun by the straggler deadline (:func:`straggler_deadline`, well below
``timeout``, or ``straggler_timeout=``) is terminated and its chunks recomputed the same way; when no
worker answers within ``timeout`` seconds, the silent ones are terminated and reported.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
from collections.abc import Callable, Sequence
from multiprocessing import connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from ....contracts.resources import local_cpu_count
from ..em_pass.chunks import (
    EncodedChunk,
    WorkerLostError,
    WorkerTask,
    WorkerTimeoutError,
    WorkerUnavailableError,
    check_tasks,
)
from ..handle import ChunkedEncodedData, handle_from_runner
from ..options import EncodedDataOptions
from ..sources.recipes import is_recipe
from .deadline import check_straggler_timeout, straggler_deadline
from .main_guard import dumps_for_workers
from .mp_layout import plan_arrays
from .mp_workers import BLAS_THREAD_VARIABLES, MPWorker, MPWorkerProcesses
from .recipe_store import touch
from .runner_families import ProcessPoolRunner

__all__ = ["BLAS_THREAD_VARIABLES", "MPChunkRunner", "WorkerTaskError", "mp_backend"]


class WorkerTaskError(RuntimeError):
    """A chunk function raised inside a worker; the message carries the worker's traceback."""


class MPChunkRunner(MPWorkerProcesses, ProcessPoolRunner):
    """Worker processes over shared memory; recomputes a dead worker's chunks on survivors.

    The processes' start, liveness and stop are ``mp_workers``'s; the plan's blocks and chunk owners are the
    process pools' (``runner_families``); this class scatters the chunks and runs the passes and placed runs."""

    name = "mp"

    def __init__(
        self,
        num_workers: int | None = None,
        *,
        timeout: float | None = 300.0,
        start_timeout: float = 180.0,
        start_method: str = "spawn",
        blas_threads: int = 1,
        shutdown_timeout: float = 5.0,
        straggler_timeout: float | None = None,
    ) -> None:
        n = self._pool_size(num_workers)
        if timeout is not None and not timeout > 0:
            raise ValueError(f"mp backend timeout must be > 0 seconds or None, got {timeout!r}")
        if isinstance(shutdown_timeout, bool) or not isinstance(shutdown_timeout, (int, float)) \
                or not shutdown_timeout >= 0:
            raise ValueError(f"mp backend shutdown_timeout must be >= 0 seconds, got {shutdown_timeout!r}")
        self.shutdown_timeout = float(shutdown_timeout)
        """Seconds ``close`` waits for each worker to exit after asking it to, before killing it."""
        self.num_workers = n
        self.timeout = timeout
        self.straggler_timeout = check_straggler_timeout(straggler_timeout, timeout)
        self.start_timeout = start_timeout
        self.blas_threads = int(blas_threads)
        self._ctx = mp.get_context(start_method)
        self._workers: list[MPWorker] = []
        self._shm: SharedMemory | None = None
        self._num_chunks = 0
        self.recovered_chunks: list[int] = []
        """Chunk ids recomputed on a survivor after their worker died or straggled (for tests and logs)."""
        self.stragglers: list[int] = []
        """Workers terminated because the others outran them by the straggler deadline (for tests and logs)."""
        self._answered: set[int] = set()  # workers whose process has answered a task: never straggling when fresh
        self._blocks: list[list[int]] | None = None
        self._reads_own = False
        """Whether the workers read their own chunks from recipes (``files``) instead of a shared block."""
        self.transport_bytes = 0
        """Bytes of pass requests (models, functions) and replies (statistics) through the workers' pipes."""
        self.transport_messages = 0
        """Requests written to and replies read from the workers' pipes so far (the harness's collective count)."""

    # -- start ----------------------------------------------------------------------------------
    def scatter(self, chunks: Sequence[EncodedChunk]) -> None:
        """Copy every chunk's arrays into one shared block and start the workers on it; recipes (``files``)
        go to every worker instead, and each reads and keeps its own block (see ``recipe_store``)."""
        if self._workers:
            raise RuntimeError("MPChunkRunner.scatter was already called; create a new runner for new data")
        if any(is_recipe(c) for c in chunks):
            self._scatter_recipes(chunks)
            return
        arrays: list[tuple[int, np.ndarray]] = []
        cursor = [0]
        layout = [(int(c.chunk_id), int(c.start), int(c.stop), plan_arrays(c.data, arrays, cursor)) for c in chunks]
        self._num_chunks = len(layout)
        self._shm = SharedMemory(create=True, size=max(cursor[0], 1))
        for offset, arr in arrays:
            dst = np.ndarray(arr.shape, dtype=arr.dtype, buffer=self._shm.buf, offset=offset)
            dst[...] = arr
            del dst
        blob = dumps_for_workers(layout)
        try:
            self._start_workers(blob)
        except BaseException:
            self.close()
            raise

    def _scatter_recipes(self, recipes: Sequence[Any]) -> None:
        """Start the workers on the recipes; each reads its block now (a bad file fails here, not mid-fit)."""
        self._num_chunks = len(recipes)
        self._reads_own = True
        try:
            self._start_workers(dumps_for_workers(list(recipes)))
            self.map_chunks(touch, None)
        except BaseException:
            self.close()
            raise

    def _request(self, worker: MPWorker, fn: Callable[[Any, Any], Any], payload: Any, ids: list[int]) -> bytes:
        """A ``map`` request; a worker reading its own chunks is also told its home when that changed."""
        home = None
        if self._reads_own:
            owners = self.chunk_owners()
            home = tuple(c for c, w in enumerate(owners) if w == worker.index)
            home, worker.home = (None if home == worker.home else home), home
        request = ("map", fn, payload, ids) if home is None else ("map", fn, payload, ids, home)
        return dumps_for_workers(request)

    # -- map --------------------------------------------------------------------------------------
    def _send(self, worker: MPWorker, message: bytes, ids: list[int]) -> bool:
        try:
            worker.conn.send_bytes(message)
        except (BrokenPipeError, ConnectionError, OSError):
            return False
        self.transport_bytes += len(message)
        self.transport_messages += 1
        worker.pending = list(ids)
        return True

    def _receive(self, worker: MPWorker) -> bytes:
        """One reply read from ``worker``'s pipe, counted (``EOFError`` when the worker is gone)."""
        if not worker.conn.poll():
            raise EOFError
        raw = worker.conn.recv_bytes()
        self.transport_bytes += len(raw)
        self.transport_messages += 1
        return raw

    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]:
        """``fn(chunk, payload)`` for each chunk id on the workers; results in chunk-id order."""
        if not self._workers and self._shm is None and not self._reads_own:
            raise RuntimeError("MPChunkRunner.map_chunks before scatter(); scatter the chunks first")
        ids = list(range(self._num_chunks)) if chunk_ids is None else sorted(int(i) for i in chunk_ids)
        results: dict[int, Any] = {}
        todo = list(ids)
        while todo:
            self._dispatch(fn, payload, todo)
            lost = self._collect(lambda w, cid, value: results.__setitem__(cid, value))
            todo = sorted(c for _, cids in lost for c in cids)
        return [results[i] for i in ids]

    # -- placement (the SDC audit recomputes a chunk on a chosen worker) -------------------------------
    def worker_ids(self) -> list[int]:
        """Ids of the live worker processes."""
        return self.live_workers

    def run_on_workers(self, tasks: dict[int, WorkerTask]) -> dict[int, list[Any]]:
        """Each worker computes its task's chunk ids; a requested worker that is gone or dies raises
        ``WorkerUnavailableError`` (the runner drops it; any worker can compute any chunk later)."""
        if self._shm is None and not self._reads_own:
            raise RuntimeError("MPChunkRunner.run_on_workers before scatter(); scatter the chunks first")
        checked = check_tasks(tasks, self._num_chunks, self.live_workers, self.name)
        by_index = {w.index: w for w in self._workers}
        sent_to_dead = []
        for index, task in checked.items():
            if not task.chunk_ids:
                continue
            message = self._request(by_index[index], task.fn, task.payload, list(task.chunk_ids))
            if not self._send(by_index[index], message, list(task.chunk_ids)):
                by_index[index].pending = list(task.chunk_ids)
                sent_to_dead.append(index)
        results: dict[tuple[int, int], Any] = {}
        lost = self._collect(lambda w, cid, value: results.__setitem__((w, cid), value))
        gone = sorted({w for w, _ in lost} | set(sent_to_dead))
        if gone:
            raise WorkerUnavailableError(gone, f"mp worker(s) {gone} died while computing chosen chunks")
        return {w: [results[(w, c)] for c in t.chunk_ids] for w, t in checked.items()}

    def _dispatch(self, fn: Callable[[Any, Any], Any], payload: Any, ids: list[int]) -> None:
        live = [w for w in self._workers if w.process.is_alive()]
        for w in [w for w in self._workers if w not in live]:
            self._drop(w)
        if not live:
            raise WorkerLostError(
                f"every mp worker has died; chunks {ids} cannot be computed. Check the workers' memory "
                "(each holds a view of the shared block) and restart with a new handle"
            )
        # Contiguous, balanced blocks of chunk ids per live worker, or the plan's (any split gives the same bits).
        n, k = len(ids), len(live)
        edges = [(i * n) // k for i in range(k + 1)]
        planned = self._planned()
        wanted = set(ids)
        for j, w in enumerate(live):
            block = [c for c in planned[j] if c in wanted] if planned else ids[edges[j] : edges[j + 1]]
            if not block:
                continue
            message = self._request(w, fn, payload, block)
            if not self._send(w, message, block):
                w.pending = list(block)  # collected as lost below

    @property
    def _deadlines(self) -> tuple[float | None, float | None]:
        return self.timeout, self.straggler_timeout  # straggler_deadline's (timeout, fixed), read per pass

    def _give_up_on_stragglers(self, busy: dict[Any, MPWorker], sentinels: dict[Any, MPWorker],
                               lost: list[tuple[int, list[int]]]) -> None:
        """Drop every busy worker that has answered before as lost (terminated), so its chunks are recomputed
        by the others; a fresh process's first task (it imports the user's modules) is waited for up to the
        timeout."""
        for w in sorted(busy.values(), key=lambda w: w.index):
            if w.index not in self._answered:
                continue
            lost.append((w.index, list(w.pending)))
            self.recovered_chunks.extend(w.pending)
            self.stragglers.append(w.index)
            w.pending = []
            del busy[w.conn]
            sentinels.pop(w.process.sentinel, None)
            self._drop(w)

    def _collect(self, store: Callable[[int, int, Any], None]) -> list[tuple[int, list[int]]]:
        """Wait for every busy worker, ``store(worker, chunk id, value)`` each result; return the
        (worker, chunk ids) of workers that died meanwhile, or that other workers outran by the
        straggler deadline (:func:`straggler_deadline`): those are terminated too."""
        busy = {w.conn: w for w in self._workers if w.pending}
        sentinels = {w.process.sentinel: w for w in busy.values()}
        lost: list[tuple[int, list[int]]] = []
        started = time.monotonic()
        deadline = None if self.timeout is None else started + self.timeout
        straggle_at: float | None = None  # set once a worker has answered: healthy ones remain
        while busy:
            ends = [t for t in (deadline, straggle_at) if t is not None]
            wait_for = None if not ends else max(0.0, min(ends) - time.monotonic())
            ready = connection.wait(list(busy) + list(sentinels), timeout=wait_for)
            if not ready and straggle_at is not None and time.monotonic() >= straggle_at:
                self._give_up_on_stragglers(busy, sentinels, lost)
                straggle_at = None  # the fresh ones left wait up to the timeout
                continue
            if not ready:
                hung = sorted(busy.values(), key=lambda w: w.index)
                detail = ", ".join(f"worker {w.index} (pid {w.process.pid}, chunks {w.pending})" for w in hung)
                for stuck in hung:
                    self._drop(stuck)
                raise WorkerTimeoutError(
                    f"mp backend: no answer within {self.timeout} s from {detail}; the worker(s) were "
                    "terminated. If the work is just slow, pass a larger timeout= to encoded_data/optimize"
                )
            for obj in ready:
                w = busy.get(obj) or sentinels.get(obj)
                if w is None or w.conn not in busy:
                    continue
                try:
                    reply = pickle.loads(self._receive(w))
                except (EOFError, ConnectionError, OSError):
                    lost.append((w.index, list(w.pending)))
                    self.recovered_chunks.extend(w.pending)
                    w.pending = []
                    del busy[w.conn]
                    sentinels.pop(w.process.sentinel, None)
                    self._drop(w)
                    continue
                if reply[0] == "error":
                    _, cid, tb = reply
                    for other in busy.values():
                        other.pending = []
                    self._drain(busy, w)
                    raise WorkerTaskError(f"mp worker {w.index} failed on chunk {cid}:\n{tb}")
                for cid, value in reply[1]:
                    store(w.index, cid, value)
                self._answered.add(w.index)
                w.pending = []
                del busy[w.conn]
                sentinels.pop(w.process.sentinel, None)
                if straggle_at is None:
                    straggle_at = started + straggler_deadline(time.monotonic() - started, *self._deadlines)
        return lost

    def _drain(self, busy: dict[Any, MPWorker], failed: MPWorker) -> None:
        """After a task error, read (and drop) the replies of the other busy workers."""
        for conn, w in list(busy.items()):
            if w is failed:
                continue
            try:
                if conn.poll(self.timeout):
                    conn.recv_bytes()
            except (EOFError, OSError):
                pass



def mp_backend(
    data: Any,
    *,
    num_workers: int | None = None,
    timeout: float | None = 300.0,
    start_timeout: float = 180.0,
    start_method: str = "spawn",
    shutdown_timeout: float = 5.0,
    straggler_timeout: float | None = None,
    **params: Any,
) -> ChunkedEncodedData:
    """Factory of the ``mp`` backend (``num_workers`` processes; default: one per resource or local CPU).

    ``params`` are the handle's options (``resources=`` places the chunks by the devices' throughput)."""
    resources = params.get("resources")
    workers = num_workers if num_workers is not None else (len(resources) if resources is not None else None)
    runner = MPChunkRunner(workers, timeout=timeout, start_timeout=start_timeout, start_method=start_method,
                           shutdown_timeout=shutdown_timeout, straggler_timeout=straggler_timeout)
    try:
        return handle_from_runner(runner, data, **params)
    except BaseException:
        runner.close()
        raise


ENCODED_DATA_OPTIONS = frozenset({
    "num_workers", "resources", "timeout", "start_timeout", "start_method", "shutdown_timeout", "straggler_timeout",
    "placement",
    "batch_size", "shuffle", "seed", "engine",
})
"""The ``encoded_data`` options the mp backend honours besides the handle's own."""

WORKER_PROCESSES = True

MAX_PROCESSES_PER_CPU = 4
MIN_PROCESS_CAP = 32
"""``num_workers`` above ``max(MIN_PROCESS_CAP, MAX_PROCESSES_PER_CPU x local CPUs)`` processes is capped:
each worker is a Python interpreter holding its chunks, and more only contend for the same cores."""


def planned_workers(options: EncodedDataOptions) -> int:
    """Worker processes mp will start: ``num_workers`` (capped), else one per resource or local CPU."""
    n = options.num_workers
    if n is None:
        n = len(options.resources) if options.resources is not None else local_cpu_count()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"mp backend num_workers must be an int >= 1, got {n!r}")
    return min(n, max(MIN_PROCESS_CAP, MAX_PROCESSES_PER_CPU * local_cpu_count()))
