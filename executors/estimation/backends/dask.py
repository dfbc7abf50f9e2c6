"""The ``dask`` chunk runner: one dask Actor per worker holds that worker's chunks resident.

``scatter`` starts one :class:`DaskChunkHolder` actor on each chosen worker (pinned there,
``allow_other_workers=False``) and loads the worker's contiguous block of chunks into it once. A
data pass then pickles ``(fn, payload)`` once and calls ``run`` on every actor: an actor call goes
from the client straight to the worker (no task through the scheduler), so a pass costs one
round trip of about 1-3 ms instead of a scheduled task per worker (about 15 ms here, which made two
workers slower than one). Actor methods run in the worker's dedicated actor thread. Chunks, the
task and the results each travel as one in-band pickle: the statistics come back as one frame, and
a chunk unpickled in the actor owns aligned memory (dask's zero-copy arrays did not, and numpy ran
slower on them).

With ``direct_channel=True`` (the default, on ``tcp://`` clusters) each holder also serves the
data passes on a socket of its own (``backends.channel``): a pass, and each placed run of the SDC audit
(borrowed chunks included), then costs a pipe-like round trip instead of two trips through dask's RPC.

When a worker dies its actor is gone (a call in flight fails with ``OSError``, later calls with
``RuntimeError``, and the actor's future turns ``error``). The runner keeps the encoded chunks on
the driver, loads the lost ones into live actors (the least-loaded survivor, or a fresh actor on a
replacement worker the cluster started) and recomputes them, as those of a straggler (``dask_channel``,
dropped from the cluster); a pass no worker finishes within ``timeout`` seconds raises ``WorkerTimeoutError``.
The actor calls themselves are ``dask_calls``; work placed on chosen workers (the audit's) is ``dask_placement``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ....contracts.resources import local_cpu_count
from ..em_pass.chunks import ChunkRunner, WorkerLostError, WorkerTimeoutError
from ..handle import handle_from_runner
from ..options import EncodedDataOptions
from .backend_declaration import refuse_for_runner
from .channel import ChannelClient, ChannelOffer
from .chunk_assignment import home_blocks, ordered_results, requested_ids
from .dask_channel import ACTOR_START_S, channel_host
from .dask_holder import (
    DaskChunkHolder,
    dask_config_for_em,
    pack_for_holder,
    work_for_holder,
)
from .dask_placement import PlacedRuns
from .dask_tasks import DaskTaskRunner, is_task_only_client, scheduler_workers
from .deadline import DEFAULT_TIMEOUT_S, Deadline, check_straggler_timeout, check_timeout
from .main_guard import require_main_guard
from .optional_engine import require_engine
from .wire_bytes import WireBytes

__all__ = ["DaskChunkHolder", "DaskRunner", "DaskTaskRunner", "channel_host", "dask_config_for_em", "dask_encoded_data"]

_log = logging.getLogger(__name__)


class DaskRunner(PlacedRuns):
    """Chunk runner over a dask.distributed ``Client`` (given, or a ``LocalCluster`` it owns)."""

    name = "dask"

    def __init__(
        self,
        client: Any = None,
        *,
        num_workers: int | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        cluster_kwargs: dict[str, Any] | None = None,
        max_recoveries: int = 8,
        direct_channel: bool = True,
        straggler_timeout: float | None = None,
    ) -> None:
        distributed = require_engine("distributed", "dask")
        self.direct_channel = bool(direct_channel)
        self._channels: dict[str, ChannelClient] = {}  # worker address -> its holder's pass socket
        self._channel_offer: ChannelOffer | None = None
        self.wire = WireBytes()
        self.timeout = check_timeout(timeout)
        self.max_recoveries = int(max_recoveries)
        self._cluster = None
        self._owns_client = client is None
        if client is None:
            from ....contracts.resources import local_cpu_count

            n = local_cpu_count() if num_workers is None else int(num_workers)
            if n < 1:
                raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
            # everything on loopback; no dashboard (an unauthenticated web UI) unless cluster_kwargs asks
            kwargs: dict[str, Any] = dict(
                n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            kwargs.update(cluster_kwargs or {})
            require_main_guard("dask", processes=kwargs.get("processes", True))  # a LocalCluster's spawn re-runs it
            with dask_config_for_em():
                self._cluster = distributed.LocalCluster(**kwargs)
            # Actor calls go straight to the worker instead of through the scheduler's proxy.
            client = distributed.Client(self._cluster, direct_to_workers=True)
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
        self._chunks: list[Any] = []
        self._where: list[str] = []
        self._actors: dict[str, Any] = {}  # worker address -> Actor handle
        self._actor_futures: dict[str, Any] = {}  # worker address -> the actor's Future (its liveness)
        self._unusable: set[str] = set()  # workers whose actor died or would not start: never used again
        self._calls = itertools.count()
        self.recoveries = 0
        """Chunks re-placed after a worker was lost (for tests and logs)."""
        self._init_stragglers(check_straggler_timeout(straggler_timeout, self.timeout))

    # -- actors -------------------------------------------------------------------------------
    def _live_workers(self) -> list[str]:
        return scheduler_workers(self.client)

    def _alive(self, address: str) -> bool:
        """Whether the actor on ``address`` exists and the scheduler still counts it as held (no round trip)."""
        future = self._actor_futures.get(address)
        return future is not None and future.status == "finished"

    def _start_actors(self, addresses: Sequence[str], timeout: float | None) -> list[str]:
        """Start one holder actor per address (pinned); returns the addresses where one is up in time."""
        distributed = require_engine("distributed", "dask")

        futures = {
            a: self.client.submit(DaskChunkHolder, self._owns_client, actor=True, workers=[a],
                                  allow_other_workers=False)
            for a in addresses
        }
        try:
            distributed.wait(list(futures.values()), timeout=timeout)
        except TimeoutError:
            pass
        started = []
        for address, future in futures.items():
            if future.status != "finished":
                _log.warning("dask: no chunk-holder actor on %s (%s)", address, future.status)
                self._cancel([future])
                self._unusable.add(address)
                continue
            with self.client.as_current():  # bind the handle to this client, not the default one
                self._actors[address] = distributed.Actor(DaskChunkHolder, address, future.key)
            self._actor_futures[address] = future
            started.append(address)
        return started

    def _forget(self, address: str) -> None:
        """Drop the actor on a worker that died (its chunks are re-placed by ``_replace``).

        The address is not used again: the scheduler can list a killed worker for a moment, and an
        actor pinned there would wait for it forever (a restarted worker gets a new address)."""
        self._unusable.add(address)
        self._actors.pop(address, None)
        future = self._actor_futures.pop(address, None)
        if future is not None:
            self._cancel([future])

    def _cancel(self, futures: list[Any]) -> None:
        try:
            self.client.cancel(futures)
        except Exception:  # noqa: BLE001 - a closed client has nothing left to release
            pass

    # -- placement ----------------------------------------------------------------------------
    def scatter(self, chunks: Sequence[Any]) -> None:
        """Load chunk ``i`` into one worker's actor (contiguous blocks, or where a recipe's ``home`` is: a recipe
        is built by the actor); the driver keeps the chunks (or their recipes) for recovery."""
        self._chunks = list(chunks)
        self._lent: list[Any] = []  # futures of chunks dask copied to a borrower (released with the next pass)
        self._where = [""] * len(self._chunks)
        for address in [a for a in self._actors if a not in self._workers]:  # recovery actors of an earlier scatter
            self._actors.pop(address)
            self._cancel([self._actor_futures.pop(address)])
        deadline = Deadline(self.timeout)
        missing = [w for w in self._workers if not self._alive(w)]
        if any(w in self._unusable for w in missing):
            raise WorkerLostError(f"dask worker(s) {[w for w in missing if w in self._unusable]} died; "
                                  "create a new handle to place the chunks on the workers there are now")
        if missing and len(self._start_actors(missing, deadline.remaining())) < len(missing):
            raise WorkerLostError(
                f"dask could not start chunk-holder actors on {[w for w in missing if not self._alive(w)]} "
                f"within {self.timeout} s; check that the workers are alive and can import mixle_parallel"
            )
        loads = {}
        for worker, ids in zip(self._workers, home_blocks(self._chunks, self._workers)):
            packed = {i: self._packed(i, worker) for i in ids}
            loads[worker] = None if None in packed.values() else self._invoke(worker, "load", packed, True)
            for i in ids:
                self._where[i] = worker
        for worker, call in loads.items():
            if self._await(worker, call, deadline, "take its chunks") is None:
                raise WorkerLostError(
                    f"dask worker {worker} died while its chunks were loaded; create the handle again"
                )

    def _replace(self, chunk_ids: list[int], deadline: Deadline) -> None:
        """Load lost chunks into live actors, each chunk onto the one holding the fewest chunks."""
        live = self._live_workers()  # survivors and any replacement the cluster started
        for address in [a for a in self._actors if a not in live or not self._alive(a)]:
            self._forget(address)
        fresh = [a for a in live if a not in self._actors and a not in self._unusable]
        if fresh:
            remaining = deadline.remaining()
            self._start_actors(fresh, ACTOR_START_S if remaining is None else min(remaining, ACTOR_START_S))
        lost = set(chunk_ids)
        while True:
            if not self._actors:
                raise WorkerLostError(
                    f"every dask worker is gone; chunks {chunk_ids} cannot be recomputed. Restart the cluster."
                )
            load = dict.fromkeys(self._actors, 0)
            for i, w in enumerate(self._where):
                if w in load and i not in lost:
                    load[w] += 1
            targets: dict[str, list[int]] = {}
            for i in chunk_ids:
                target = min(load, key=lambda w: (load[w], w))
                load[target] += 1
                targets.setdefault(target, []).append(i)
            _log.warning("dask: re-placing lost chunks %s onto %s", chunk_ids, sorted(targets))
            calls = {}
            for t, ids in targets.items():
                packed = {i: self._packed(i, t) for i in ids}
                calls[t] = None if None in packed.values() else self._invoke(t, "load", packed)
            results = [self._await(t, call, deadline, f"take lost chunks {targets[t]}") for t, call in calls.items()]
            if None not in results:
                break  # else a target died too: place again on the actors left
        for target, ids in targets.items():
            for i in ids:
                self._where[i] = target
        self.recoveries += len(chunk_ids)

    # -- data passes --------------------------------------------------------------------------
    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]:
        """``fn(chunk, payload)`` on the worker holding each chunk; results in chunk-id order.

        One actor call per worker and pass, ``(fn, payload)`` pickled once; chunks of a worker
        that died are loaded into live actors and recomputed there.
        """
        ids = requested_ids(chunk_ids, len(self._chunks))
        deadline = Deadline(self.timeout)
        task = pack_for_holder((fn, payload), task=True)
        gone = [i for i in ids if not self._alive(self._where[i])]
        if gone:  # a worker died between passes
            self._replace(gone, deadline)
        for address in [a for a in self._channels if a not in self._actors]:
            self._drop_channel(address)
        if self.direct_channel and all(self._channel_for(a) is not None for a in {self._where[i] for i in ids}):
            return self._map_direct(task, ids, deadline)
        pending = self._dispatch(task, ids)
        results: dict[int, Any] = {}
        losses = 0

        def timed_out() -> WorkerTimeoutError:
            hung: dict[str, list[int]] = {}
            for address, _, wids in pending.values():
                hung.setdefault(address, []).extend(wids)
            return self._pass_timeout(hung)

        clock = self._straggler_clock()
        for _, (_, _, wids), values in self._settle(pending, deadline, timed_out, clock):
            if values is not None:
                results.update(zip(wids, values))
                continue
            losses += 1
            self._check_losses(losses, wids)
            self._replace(sorted(wids), deadline)
            pending.update(self._dispatch(task, sorted(wids)))
            clock.restart()  # the survivors' recomputation is a race of its own
        return ordered_results(results, ids, self.name)

    def _dispatch(self, task: bytes, ids: list[int]) -> dict[int, tuple[str, Any, list[int]]]:
        """One ``run`` call per actor over the chunks it holds: call key -> (address, call, chunk ids)."""
        by_worker: dict[str, list[int]] = {}
        for i in ids:
            by_worker.setdefault(self._where[i], []).append(i)
        return {
            next(self._calls): (address, self._invoke(address, "run", task, work_for_holder(wids)), wids)
            for address, wids in sorted(by_worker.items())
        }

    # -- lifetime -----------------------------------------------------------------------------
    def worker_pids(self) -> dict[int, int]:
        """Process id of each live chosen worker's actor, by worker id (tests kill them)."""
        deadline = Deadline(self.timeout)
        calls = {w: self._invoke(self._workers[w], "pid") for w in self.worker_ids()}
        pids = {w: self._await(self._workers[w], call, deadline, "report its pid") for w, call in calls.items()}
        return {w: pid for w, pid in pids.items() if pid is not None}

    def close(self) -> None:
        """Release the actors and the chunks they hold; shut down the cluster when this runner started it."""
        for address in list(self._channels):
            self._drop_channel(address)
        futures = list(self._actor_futures.values())
        self._actors, self._actor_futures = {}, {}
        if futures:
            self._cancel(futures)
        self._chunks = []
        if self._owns_client:
            try:
                self.client.close()
            finally:
                if self._cluster is not None:
                    self._cluster.close()
                    self._cluster = None


def dask_encoded_data(data: Any, *, client: Any = None, num_workers: int | None = None, **params: Any) -> Any:
    """``encoded_data(..., backend="dask")``: a handle over a :class:`DaskRunner`, or a :class:`DaskTaskRunner`
    for a client that only submits and gathers. ``timeout=``, ``straggler_timeout=`` and ``direct_channel=``
    (``False`` sends every pass through dask's RPC, see ``backends.channel``) are the resident runner's: with a
    task-only client they are refused. ``params`` are the handle's options."""
    engine: dict[str, Any] = {k: params.pop(k) for k in ("timeout", "direct_channel", "straggler_timeout")
                              if k in params}
    runner: ChunkRunner
    if is_task_only_client(client, require_engine("distributed", "dask")):
        refuse_for_runner("dask", engine, f"a {type(client).__name__} that only submits and gathers",
                          "a distributed.Client")
        runner = DaskTaskRunner(client, num_workers=num_workers)
    else:
        runner = DaskRunner(client, num_workers=num_workers, **engine)
    try:
        return handle_from_runner(runner, data, **params)
    except BaseException:
        runner.close()
        raise


ENCODED_DATA_OPTIONS = frozenset({"client", "num_workers", "timeout", "direct_channel", "straggler_timeout",
                                  "batch_size", "shuffle", "seed"})
"""The ``encoded_data`` options the dask backend honours besides the handle's own."""

WORKER_PROCESSES = True


def planned_workers(options: EncodedDataOptions) -> int:
    """``num_workers``, else the client's workers (any client with ``scheduler_info()``), else the local CPUs."""
    require_engine("distributed", "dask")
    if options.client is None:  # a LocalCluster we start: checked before the admission gate, which may certify
        require_main_guard("dask", processes=(options.extra.get("cluster_kwargs") or {}).get("processes", True))
        return local_cpu_count() if options.num_workers is None else int(options.num_workers)
    if options.num_workers is not None:
        return int(options.num_workers)
    return max(1, len(scheduler_workers(options.client)))
