"""The ``dask`` chunk runner: chunks scattered once onto dask.distributed workers.

Each chunk is scattered (``client.scatter``) to one worker, in contiguous blocks, and every data
pass submits one task per worker, pinned there, over the chunks it holds. When a worker dies its scattered
chunks are lost (dask cannot recompute scattered data), so the runner keeps the encoded chunks on
the driver, re-scatters the lost ones onto live workers and resubmits; a pass that does not finish
within ``timeout`` seconds raises ``WorkerTimeoutError`` instead of waiting forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from .engine_support import (
    DEFAULT_TIMEOUT_S,
    Deadline,
    block_assignment,
    check_timeout,
    ordered_results,
    prepare_worker,
    require_engine,
    requested_ids,
)
from .runner import WorkerLostError, WorkerTask, WorkerTimeoutError, WorkerUnavailableError, check_tasks

__all__ = ["DaskRunner", "dask_config_for_em", "dask_encoded_data"]

_log = logging.getLogger(__name__)


def _apply_batch(fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: list[int], *chunks: Any) -> list[tuple[int, Any]]:
    """Run ``fn`` over a worker's resident chunks (module-level so dask pickles it by reference)."""
    return [(i, fn(chunk, payload)) for i, chunk in zip(chunk_ids, chunks)]


def dask_config_for_em() -> Any:
    """Dask settings for workers this runner starts: numeric passes at full speed.

    Dask's default ``MALLOC_TRIM_THRESHOLD_=65536`` makes every large numpy temporary a fresh
    ``mmap`` (page faults on each E-step), and its statistical profiler samples the task thread
    every 10 ms; measured together they made a worker's E-step about 3x slower than the same call
    in the driver. BLAS stays capped to one thread per worker.
    """
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    return dask.config.set({
        "distributed.nanny.pre-spawn-environ": environ,
        "distributed.worker.profile.enabled": False,
    })


class DaskRunner:
    """Chunk runner over a dask.distributed ``Client`` (given, or a ``LocalCluster`` it owns)."""

    name = "dask"
    supports_worker_placement = True

    def __init__(
        self,
        client: Any = None,
        *,
        num_workers: int | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        cluster_kwargs: dict[str, Any] | None = None,
        max_recoveries: int = 8,
    ) -> None:
        distributed = require_engine("distributed", "dask")
        self.timeout = check_timeout(timeout)
        self.max_recoveries = int(max_recoveries)
        self._cluster = None
        self._owns_client = client is None
        if client is None:
            from mixle_parallel.contracts.resources import local_cpu_count

            n = local_cpu_count() if num_workers is None else int(num_workers)
            if n < 1:
                raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
            kwargs: dict[str, Any] = dict(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                silence_logs=logging.ERROR,
            )
            kwargs.update(cluster_kwargs or {})
            with dask_config_for_em():
                self._cluster = distributed.LocalCluster(**kwargs)
            client = distributed.Client(self._cluster)
        self.client = client
        workers = self._live_workers()
        if not workers:
            raise ValueError("the dask client has no workers; start the cluster's workers before encoded_data()")
        if num_workers is not None and not self._owns_client:
            if not 1 <= num_workers <= len(workers):
                raise ValueError(
                    f"num_workers={num_workers!r} but the dask client has {len(workers)} worker(s); "
                    "pass num_workers=None to use them all, or start more workers"
                )
            workers = workers[: int(num_workers)]
        self._workers = workers
        self.num_workers = len(workers)
        if self._owns_client:
            self.client.run(prepare_worker)
        self._chunks: list[Any] = []
        self._futures: list[Any] = []
        self._where: list[str] = []
        self.recoveries = 0
        """Chunks re-placed after a worker was lost (for tests and logs)."""

    # -- placement ----------------------------------------------------------------------------
    def _live_workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def scatter(self, chunks: Sequence[Any]) -> None:
        """Place chunk ``i`` on one worker (contiguous blocks); the driver keeps them for recovery."""
        self._release()
        self._chunks = list(chunks)
        self._futures = [None] * len(self._chunks)
        self._where = [""] * len(self._chunks)
        for worker, ids in zip(self._workers, block_assignment(len(self._chunks), self.num_workers)):
            if not ids:
                continue
            futures = self.client.scatter([self._chunks[i] for i in ids], workers=[worker], hash=False)
            for i, fut in zip(ids, futures):
                self._futures[i], self._where[i] = fut, worker

    def _replace(self, chunk_ids: list[int]) -> None:
        """Re-scatter lost chunks, each onto the live worker holding the fewest chunks."""
        live = self._live_workers()  # survivors and any replacement the cluster started
        if not live:
            raise WorkerLostError(
                f"every dask worker is gone; chunks {chunk_ids} cannot be recomputed. Restart the cluster."
            )
        load = dict.fromkeys(live, 0)
        lost = set(chunk_ids)
        for i, w in enumerate(self._where):
            if w in load and i not in lost:
                load[w] += 1
        targets: dict[str, list[int]] = {}
        for i in chunk_ids:
            target = min(live, key=lambda w: (load[w], w))
            load[target] += 1
            targets.setdefault(target, []).append(i)
        _log.warning("dask: re-placing lost chunks %s onto %s", chunk_ids, sorted(targets))
        for target, ids in targets.items():
            futures = self.client.scatter([self._chunks[i] for i in ids], workers=[target], hash=False)
            for i, fut in zip(ids, futures):
                self._futures[i], self._where[i] = fut, target
        self.recoveries += len(chunk_ids)

    def _submit(self, fn: Callable[[Any, Any], Any], chunk_ids: list[int], payload: Any) -> dict[Any, list[int]]:
        """One task per worker over the chunks it holds (re-placing lost chunks first)."""
        lost = [i for i in chunk_ids if self._futures[i] is None or self._futures[i].status != "finished"]
        if lost:
            self._replace(lost)
        by_worker: dict[str, list[int]] = {}
        for i in chunk_ids:
            by_worker.setdefault(self._where[i], []).append(i)
        return {
            self.client.submit(
                _apply_batch, fn, payload, wids, *[self._futures[i] for i in wids], pure=False,
                workers=[worker], allow_other_workers=False,
            ): wids
            for worker, wids in sorted(by_worker.items())
        }

    # -- data passes --------------------------------------------------------------------------
    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]:
        """``fn(chunk, payload)`` on the worker holding each chunk; results in chunk-id order.

        One task per worker and pass; a task lost with its worker is resubmitted after its
        chunks are re-placed on live workers.
        """
        distributed = require_engine("distributed", "dask")
        from distributed.utils import CancelledError

        ids = requested_ids(chunk_ids, len(self._chunks))
        deadline = Deadline(self.timeout)
        pending = self._submit(fn, ids, payload)
        results: dict[int, Any] = {}
        losses = 0
        while pending:
            try:
                distributed.wait(list(pending), timeout=deadline.remaining(), return_when="FIRST_COMPLETED")
            except (TimeoutError, CancelledError):
                pass  # a timeout or cancelled futures: inspected one by one below
            progressed = False
            for fut in [f for f in pending if f.status == "finished"]:
                try:
                    pairs = fut.result()
                except CancelledError:
                    continue  # the result was on a worker that died: handled as lost below
                results.update(pairs)
                del pending[fut]
                progressed = True
            lost: list[int] = []
            for fut in list(pending):
                if fut.status == "error":
                    fut.result()  # fn raised on the worker: propagate its exception
                elif fut.status in ("cancelled", "lost", "finished"):
                    lost.extend(pending.pop(fut))
            if lost:
                losses += 1
                if losses > self.max_recoveries:
                    raise WorkerLostError(
                        f"dask lost chunks {sorted(lost)} {losses} times in one pass (workers keep dying); "
                        "check the workers' memory limits and logs"
                    )
                pending.update(self._submit(fn, sorted(lost), payload))
                progressed = True
            if pending and not progressed and deadline.expired():
                waiting = sorted(i for wids in pending.values() for i in wids)
                hung = sorted({self._where[i] for i in waiting})
                self.client.cancel(list(pending))
                raise WorkerTimeoutError(
                    f"dask worker(s) {hung} did not return chunk(s) {waiting} within "
                    f"{self.timeout} s; a worker is hung or overloaded. Raise timeout= (seconds) "
                    "or restart the hung worker."
                )
        return ordered_results(results, ids, self.name)

    # -- placement (the SDC audit recomputes a chunk on a chosen worker) -----------------------
    def worker_ids(self) -> list[int]:
        """Ids (positions in the worker list fixed at start) of the workers still in the cluster."""
        live = set(self._live_workers())
        return [i for i, address in enumerate(self._workers) if address in live]

    def chunk_owners(self) -> list[int]:
        """The worker id each chunk is resident on (-1 for a chunk re-placed on a worker not in the list)."""
        index = {address: i for i, address in enumerate(self._workers)}
        return [index.get(address, -1) for address in self._where]

    def run_on_workers(self, tasks: dict[int, WorkerTask]) -> dict[int, list[Any]]:
        """One task per chosen worker, pinned there (chunks held elsewhere are moved by dask); a chosen
        worker that is gone raises ``WorkerUnavailableError``. A task lost only because a chunk it was
        fetching died with another worker is run again on its own, still live, worker."""
        checked = check_tasks(tasks, len(self._chunks), self.worker_ids(), self.name)
        out: dict[int, list[Any]] = {w: [] for w in checked}
        pending = {w: t for w, t in checked.items() if t.chunk_ids}
        for _ in range(self.num_workers + 1):
            done, gone = self._run_round(pending)
            out.update(done)
            live = set(self._live_workers())
            dead = [w for w in gone if self._workers[w] not in live]
            if dead:
                raise WorkerUnavailableError(dead, f"dask worker(s) {[self._workers[w] for w in dead]} were lost "
                                                   "while computing chosen chunks")
            if not gone:
                return out
            pending = {w: pending[w] for w in gone}  # their inputs died elsewhere: fetch again
        raise WorkerUnavailableError(sorted(pending), f"dask worker(s) {[self._workers[w] for w in pending]} "
                                                      "kept losing their tasks")

    def _run_round(self, tasks: dict[int, WorkerTask]) -> tuple[dict[int, list[Any]], list[int]]:
        """Submit one pinned task per worker; (results by worker, workers whose task was lost)."""
        distributed = require_engine("distributed", "dask")
        from distributed.utils import CancelledError

        needed = sorted({i for t in tasks.values() for i in t.chunk_ids})
        lost = [i for i in needed if self._futures[i] is None or self._futures[i].status != "finished"]
        if lost:
            self._replace(lost)
        futures = {
            self.client.submit(_apply_batch, t.fn, t.payload, list(t.chunk_ids), *[self._futures[i] for i in t.chunk_ids],
                               pure=False, workers=[self._workers[w]], allow_other_workers=False): w
            for w, t in tasks.items()
        }
        try:
            distributed.wait(list(futures), timeout=self.timeout)
        except (TimeoutError, CancelledError):
            pass
        out: dict[int, list[Any]] = {}
        gone: list[int] = []
        for fut, w in futures.items():
            if fut.status == "finished":
                try:
                    out[w] = [value for _, value in fut.result()]
                    continue
                except CancelledError:
                    pass
            elif fut.status == "error":
                fut.result()  # fn raised on the worker: propagate its exception
            elif fut.status == "pending":
                self.client.cancel(list(futures))
                raise WorkerTimeoutError(f"dask worker {self._workers[w]} did not return chunks {list(tasks[w].chunk_ids)} "
                                         f"within {self.timeout} s; raise timeout= (seconds) or restart it")
            gone.append(w)
        return out, gone

    def compute_on(self, worker: int, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int]) -> list[Any]:
        """``fn`` over ``chunk_ids`` on worker ``worker``."""
        return self.run_on_workers({worker: WorkerTask(fn, payload, tuple(chunk_ids))})[worker]

    # -- lifetime -----------------------------------------------------------------------------
    def _release(self) -> None:
        futures = [f for f in self._futures if f is not None]
        if futures:
            try:
                self.client.cancel(futures)
            except Exception:  # noqa: BLE001 - a closed client has nothing left to release
                pass
        self._futures = []

    def close(self) -> None:
        """Release the scattered chunks; shut down the cluster when this runner started it."""
        self._release()
        self._chunks = []
        if self._owns_client:
            try:
                self.client.close()
            finally:
                if self._cluster is not None:
                    self._cluster.close()
                    self._cluster = None


def dask_encoded_data(
    data: Any,
    *,
    client: Any = None,
    num_workers: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    **params: Any,
) -> Any:
    """``encoded_data(..., backend="dask")``: a handle over a :class:`DaskRunner`."""
    from .runner import handle_from_runner

    runner = DaskRunner(client, num_workers=num_workers, timeout=timeout)
    try:
        return handle_from_runner(runner, data, **params)
    except BaseException:
        runner.close()
        raise
