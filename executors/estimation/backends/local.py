"""The ``local`` backend: chunks stay in this process, a reused thread pool maps over them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ....contracts.resources import local_cpu_count
from ..em_pass.chunks import WorkerTask, apply_chunk_fn, check_tasks
from ..handle import ChunkedEncodedData, handle_from_runner
from ..options import EncodedDataOptions
from ..sources.files import forget_reads
from ..sources.recipes import is_recipe, materialize
from .runner_families import ProcessPoolRunner

__all__ = ["LocalChunkRunner", "local_backend"]


class LocalChunkRunner(ProcessPoolRunner):
    """Chunk-level thread pool (numpy releases the GIL in its kernels); one worker runs inline."""

    name = "local"
    transport_bytes = 0
    """Threads share the driver's memory: nothing crosses a process boundary."""
    transport_messages = 0
    """Tasks handed to worker threads and results taken back so far (the thread pool is this runner's transport)."""

    def __init__(self, num_workers: int | None = None) -> None:
        self.num_workers = self._pool_size(num_workers)
        self._chunks: list[Any] = []
        self._num_chunks = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pinned: list[ThreadPoolExecutor] = []
        self._blocks: list[list[int]] | None = None

    def scatter(self, chunks: Sequence[Any]) -> None:
        """Keep the encoded chunks (list index = chunk id); recipes (``files``) are read and encoded here."""
        self._chunks = [materialize(c) for c in chunks]
        self._num_chunks = len(self._chunks)
        if any(is_recipe(c) for c in chunks):
            forget_reads()  # the last row group read stays with no chunk

    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]:
        """``fn(chunk, payload)`` per chunk id, results in chunk-id order."""
        ids = range(len(self._chunks)) if chunk_ids is None else sorted(chunk_ids)
        if self._blocks is not None and len(ids) > 1:  # a plan's blocks, each on its worker thread
            wanted = set(ids)
            tasks = {w: WorkerTask(fn, payload, tuple(c for c in b if c in wanted)) for w, b in enumerate(self._blocks)}
            out = self.run_on_workers({w: t for w, t in tasks.items() if t.chunk_ids})
            values = {c: v for w, vs in out.items() for c, v in zip(tasks[w].chunk_ids, vs)}
            return [values[i] for i in ids]
        if self.num_workers == 1 or len(ids) <= 1:
            return apply_chunk_fn(fn, payload, list(ids), self._chunks.__getitem__)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="mixle-em-local")
        futures = [self._pool.submit(fn, self._chunks[i], payload) for i in ids]
        self.transport_messages += 2 * len(futures)  # each task handed over, each result taken back
        return [f.result() for f in futures]

    # -- placement (the SDC audit recomputes a chunk on another worker thread) ---------------------
    def worker_ids(self) -> list[int]:
        """Worker thread ids ``0..num_workers-1``."""
        return list(range(self.num_workers))

    def run_on_workers(self, tasks: dict[int, WorkerTask]) -> dict[int, list[Any]]:
        """Each task on its own pinned worker thread; results per worker in the order of its ids."""
        checked = check_tasks(tasks, len(self._chunks), self.worker_ids(), self.name)
        if not self._pinned:
            self._pinned = [ThreadPoolExecutor(1, thread_name_prefix=f"mixle-em-local-w{w}")
                            for w in range(self.num_workers)]

        def run(task: WorkerTask) -> list[Any]:
            return apply_chunk_fn(task.fn, task.payload, task.chunk_ids, self._chunks.__getitem__)

        futures = {w: self._pinned[w].submit(run, t) for w, t in checked.items()}
        self.transport_messages += 2 * len(futures)
        return {w: f.result() for w, f in futures.items()}

    def close(self) -> None:
        """Stop the thread pools and drop the chunks."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for pool in self._pinned:
            pool.shutdown(wait=True)
        self._pinned = []
        self._chunks = []
        self._num_chunks = 0


def local_backend(
    data: Any,
    *,
    num_workers: int | None = None,
    chunk_workers: int | None = None,
    parallel_chunks: bool = False,
    **params: Any,
) -> ChunkedEncodedData:
    """Factory of the ``local`` backend: one thread by default, ``num_workers`` threads on request.

    ``params`` are the handle's options (``resources=`` gives a thread per device, the chunks placed by
    the devices' throughput)."""
    workers = num_workers if num_workers is not None else chunk_workers
    if workers is None:
        if params.get("resources") is not None:
            workers = len(params["resources"])
        elif parallel_chunks:
            workers = local_cpu_count()
        else:
            workers = 1
    return handle_from_runner(LocalChunkRunner(workers), data, **params)


ENCODED_DATA_OPTIONS = frozenset({"num_workers", "chunk_workers", "parallel_chunks", "resources", "placement",
                                  "batch_size", "shuffle", "seed", "engine"})
"""The ``encoded_data`` options the local backend honours besides the handle's own."""

WORKER_PROCESSES = False
"""Threads inside this process: a world of one process."""

MAX_THREADS_PER_CPU = 4
MIN_THREAD_CAP = 64
"""``num_workers`` above ``max(MIN_THREAD_CAP, MAX_THREADS_PER_CPU x local CPUs)`` threads is capped:
more only contend for the same cores (and 10**6 threads would exhaust the process)."""


def planned_workers(options: EncodedDataOptions) -> int:
    """Threads the local backend will run: ``num_workers`` (capped), else ``chunk_workers``/``resources``, else 1
    (one per CPU with ``parallel_chunks``); contradicting counts are refused."""
    if None not in (options.num_workers, options.chunk_workers) and options.num_workers != options.chunk_workers:
        raise ValueError(f"num_workers={options.num_workers} and chunk_workers={options.chunk_workers} both set the "
                         "local backend's threads; give one")
    n = options.num_workers if options.num_workers is not None else options.chunk_workers
    if options.parallel_chunks and n == 1:
        raise ValueError("parallel_chunks=True asks for chunk threads but the local backend was given one thread; "
                         "drop parallel_chunks= or give num_workers= above 1")
    if n is None:
        n = len(options.resources) if options.resources is not None else (
            local_cpu_count() if options.parallel_chunks else 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"local backend num_workers must be an int >= 1, got {n!r}")
    return min(n, max(MIN_THREAD_CAP, MAX_THREADS_PER_CPU * local_cpu_count()))
