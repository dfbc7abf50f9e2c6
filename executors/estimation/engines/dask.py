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
data passes on a socket of its own (``engines.channel``): a pass, and each placed run of the SDC audit
(borrowed chunks included), then costs a pipe-like round trip instead of two trips through dask's RPC.

When a worker dies its actor is gone (a call in flight fails with ``OSError``, later calls with
``RuntimeError``, and the actor's future turns ``error``). The runner keeps the encoded chunks on
the driver, loads the lost ones into live actors (the least-loaded survivor, or a fresh actor on a
replacement worker the cluster started) and recomputes them, as those of a straggler (``dask_channel``,
dropped from the cluster); a pass no worker finishes within ``timeout`` seconds raises ``WorkerTimeoutError``.
"""

from __future__ import annotations

import itertools
import logging
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ....contracts.resources import local_cpu_count
from ..em_pass.chunks import (
    ChunkRunner,
    WorkerLostError,
    WorkerTask,
    WorkerTimeoutError,
    WorkerUnavailableError,
    check_tasks,
)
from ..handle import handle_from_runner
from ..options import EncodedDataOptions
from .backend_declaration import refuse_for_runner
from .channel import ChannelClient, ChannelOffer, collect_replies
from .chunk_assignment import home_blocks, ordered_results, requested_ids
from .dask_channel import ACTOR_START_S, POLL_S, DirectPasses, call_outcomes, channel_host
from .dask_holder import (
    DaskChunkHolder,
    dask_config_for_em,
    pack_for_holder,
    work_for_holder,
)
from .dask_tasks import DaskTaskRunner, is_task_only_client, scheduler_workers
from .deadline import DEFAULT_TIMEOUT_S, Deadline, StragglerClock, check_straggler_timeout, check_timeout
from .main_guard import require_main_guard
from .optional_engine import require_engine
from .wire_bytes import WireBytes

__all__ = ["DaskChunkHolder", "DaskRunner", "DaskTaskRunner", "channel_host", "dask_config_for_em", "dask_encoded_data"]

_log = logging.getLogger(__name__)


class _PlacedCalls(NamedTuple):
    """The calls of one placed run: dask calls pending (worker -> (address, future)), pass channels sent to,
    the chunk ids of each dask call, and the orphaned chunks each worker keeps."""

    pending: dict[int, tuple[str, Any]]
    direct: dict[int, ChannelClient]
    sent: dict[int, list[int]]
    adopted: dict[int, list[int]]


class DaskRunner(DirectPasses):
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

    # -- calls --------------------------------------------------------------------------------
    def _invoke(self, address: str, method: str, *args: Any) -> Any:
        """Start ``method(*args)`` on the actor of ``address``; None when that actor is already gone."""
        actor = self._actors.get(address)
        if actor is None or not self._alive(address):
            return None
        try:
            call = getattr(actor, method)(*args)
        except Exception:  # noqa: BLE001 - the handle refuses calls once its worker is lost
            return None
        if method == "run":  # a pass through dask's RPC: the task, work and borrowed chunks, all bytes
            self.wire.count_sent(*args)
        return call

    def _await(self, address: str, call: Any, deadline: Deadline, what: str) -> Any:
        """The value of a (non-``run``) actor call; None when its worker was lost; past the deadline
        ``WorkerTimeoutError`` saying the worker did not ``what``."""
        while call is not None:
            if call.done():
                try:
                    return call.result()
                except Exception as exc:  # noqa: BLE001 - the call failed: the worker is gone
                    _log.warning("dask: worker %s was lost during a call (%r)", address, exc)
                    break
            if not self._alive(address):
                break
            if deadline.expired():
                raise WorkerTimeoutError(
                    f"dask worker {address} did not {what} within {self.timeout} s; "
                    "raise timeout= (seconds) or restart it"
                )
            self._wait_some([call], deadline)
        self._forget(address)
        return None

    def _settle(self, pending: dict[Any, tuple[Any, ...]], deadline: Deadline, timed_out: Callable[[], Exception],
                clock: StragglerClock | None = None) -> Any:
        """Yield ``(key, entry, values)`` as the calls of ``pending`` (key -> ``(address, call, ...)``)
        settle, removing each; ``values`` is None when the worker was lost (then forgotten), or outrun by the
        straggler ``clock`` (then also dropped). The caller may add calls between yields. When nothing settles
        by the deadline, raises ``timed_out()``.

        One hand-off to the client's event loop waits for every pending call at once (up to the poll
        interval) and brings back the outcomes of those that finished: each ``ActorFuture.result()``
        would be a hand-off of its own, three or four per pass."""
        while pending:
            calls = {key: entry[1] for key, entry in pending.items() if entry[1] is not None}
            remaining = deadline.remaining()
            wait = POLL_S if remaining is None else min(POLL_S, remaining)
            outcomes = self.client.sync(call_outcomes, calls, wait) if calls else {}
            progressed = False
            outrun = clock is not None and not outcomes and clock.due()
            for key, entry in list(pending.items()):
                address, call = entry[0], entry[1]
                if key in outcomes:
                    values = self._decode(address, *outcomes[key])
                elif call is None or not self._alive(address):
                    values = None
                elif outrun and address in self._answered:
                    self._outrun(address, list(entry[2]) if len(entry) > 2 else [])  # (address, call, chunk ids)
                    values = None
                else:
                    continue
                del pending[key]
                progressed = True
                if values is None:
                    self._forget(address)
                elif clock is not None:
                    self._answered.add(address)
                    clock.answered()
                yield key, entry, values
            if outrun and clock is not None:
                clock.restart() if progressed else clock.disarm()
            if pending and not progressed and deadline.expired():
                raise timed_out()

    def _decode(self, address: str, ok: bool, value: Any) -> Any:
        """A finished ``run`` call's results; None when the call failed (its worker is gone); ``fn``'s
        own error is raised."""
        if not ok:
            _log.warning("dask: worker %s was lost during a call (%r)", address, value)
            return None
        self.wire.count_received(value)
        status, result = pickle.loads(value)
        if status == "raised":
            raise result
        return result

    @staticmethod
    def _wait_some(calls: list[Any], deadline: Deadline) -> None:
        """Block until the first unfinished call finishes, the poll interval passes, or the deadline."""
        remaining = deadline.remaining()
        wait = POLL_S if remaining is None else min(POLL_S, remaining)
        for call in calls:
            if call is not None and not call.done():
                try:
                    call.result(timeout=wait)
                except Exception:  # noqa: BLE001 - timeouts and failures are read by the caller
                    pass
                return

    def _check_losses(self, losses: int, chunk_ids: Sequence[int]) -> None:
        """Give up a pass whose workers keep dying (``max_recoveries`` losses)."""
        if losses > self.max_recoveries:
            raise WorkerLostError(
                f"dask lost chunks {sorted(chunk_ids)} {losses} times in one pass (workers keep dying); "
                "check the workers' memory limits and logs"
            )

    def _pass_timeout(self, hung: Mapping[str, Sequence[int]]) -> WorkerTimeoutError:
        """The error of a pass whose workers (address -> chunk ids owed) did not answer in time."""
        return WorkerTimeoutError(
            f"dask worker(s) {sorted(hung)} did not return chunk(s) {sorted(i for ids in hung.values() for i in ids)} "
            f"within {self.timeout} s; a worker is hung or overloaded. Raise timeout= (seconds) or restart the "
            "hung worker."
        )

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

        for _, (_, _, wids), values in self._settle(pending, deadline, timed_out, self._straggler_clock()):
            if values is not None:
                results.update(zip(wids, values))
                continue
            losses += 1
            self._check_losses(losses, wids)
            self._replace(sorted(wids), deadline)
            pending.update(self._dispatch(task, sorted(wids)))
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

    # -- placement (the SDC audit recomputes a chunk on a chosen worker) -----------------------
    def worker_ids(self) -> list[int]:
        """Ids (positions in the worker list fixed at start) of the workers whose holder is alive.

        Read from the holders' futures, which the scheduler turns to ``error`` when it loses a worker:
        no round trip (asking the scheduler each time cost ~1 ms, and an audited pass asks 4-5 times);
        a worker lost a moment ago that still reads as alive fails its next call, which recovers."""
        return [i for i, address in enumerate(self._workers) if self._alive(address)]

    def chunk_owners(self) -> list[int]:
        """The worker id each chunk is resident on (-1 for a chunk re-placed on a worker not in the list)."""
        index = {address: i for i, address in enumerate(self._workers)}
        return [index.get(address, -1) for address in self._where]

    def run_on_workers(self, tasks: dict[int, WorkerTask]) -> dict[int, list[Any]]:
        """One actor call per chosen worker; chunks it does not hold are sent from the driver's copy and
        not kept, except a chunk whose holder died, which stays on the (first) worker that computes it.
        A chosen worker that is gone, or dies meanwhile, raises ``WorkerUnavailableError``."""
        checked = check_tasks(tasks, len(self._chunks), self.worker_ids(), self.name)
        deadline = Deadline(self.timeout)
        calls = self._send_placed(checked)
        values = self._collect_placed(checked, calls, deadline)
        return {w: [values[w][i] for i in t.chunk_ids] for w, t in checked.items()}

    def _send_placed(self, checked: dict[int, WorkerTask]) -> _PlacedCalls:
        """Send each chosen worker its task: over its pass channel, or as a dask call (orphaned chunks it keeps)."""
        calls = _PlacedCalls({}, {}, {}, {})
        self._lent = []  # the chunks lent in the last pass are in their borrowers' hands or done with
        for w, t in sorted(checked.items()):
            if not t.chunk_ids:
                continue
            address = self._workers[w]
            task = pack_for_holder((t.fn, t.payload), task=True)
            ids = list(t.chunk_ids)
            packed = {i: self._packed(i, address) for i in dict.fromkeys(ids) if self._where[i] != address}
            borrowed = {i: blob for i, blob in packed.items() if blob is not None}
            if len(borrowed) < len(packed):  # the worker is gone, or was given up while chunks were moved there
                calls.sent[w], calls.pending[w] = ids, (address, None)
                continue
            orphans = [
                i
                for i in dict.fromkeys(borrowed)
                if not self._alive(self._where[i]) and all(i not in kept for kept in calls.adopted.values())
            ]
            calls.adopted[w] = orphans
            # over the holder's pass channel, borrowed chunks included, unless a dead holder's chunks are
            # to stay here (that goes through dask); one call either way, so one thread computes
            channel = None if orphans else self._channel_for(address)  # opened here when no plain pass came first
            if channel is not None and channel.send(task, ids, borrowed):
                calls.direct[w] = channel
                calls.sent[w] = []
                continue
            calls.sent[w] = ids
            calls.pending[w] = (
                address,
                self._invoke(address, "run", task, work_for_holder(ids, orphans), *([borrowed] if borrowed else [])),
            )
        return calls

    def _collect_placed(self, checked: dict[int, WorkerTask], calls: _PlacedCalls,
                        deadline: Deadline) -> dict[int, dict[int, Any]]:
        """Every chosen worker's results by chunk id; lost workers raise ``WorkerUnavailableError``."""
        values: dict[int, dict[int, Any]] = {w: {} for w in checked}
        clock = self._straggler_clock()
        answered = {w for w in calls.direct if self._workers[w] in self._answered}
        got, closed, hung, outrun = collect_replies(calls.direct, deadline.remaining, clock, answered)
        for w in outrun:  # a straggler among workers that answered: lost to this placed run, like a dead one
            self._outrun(self._workers[w], list(checked[w].chunk_ids))
        if hung:
            raise WorkerTimeoutError(
                f"dask worker(s) {[self._workers[w] for w in hung]} did not return chunks "
                f"within {self.timeout} s; raise timeout= (seconds) or restart it"
            )
        for w, (ids, entries) in got.items():
            values[w].update(zip(ids, entries))
            self._answered.add(self._workers[w])
        dead: list[int] = list(closed) + list(outrun)
        for w in dead:
            self._drop_channel(self._workers[w])

        def timed_out() -> WorkerTimeoutError:
            w = min(calls.pending)
            return WorkerTimeoutError(
                f"dask worker {self._workers[w]} did not return chunks "
                f"{list(checked[w].chunk_ids)} within {self.timeout} s; "
                "raise timeout= (seconds) or restart it"
            )

        for w, (address, _), entries in self._settle(calls.pending, deadline, timed_out, clock):
            if entries is None:
                dead.append(w)
                continue
            values[w].update(zip(calls.sent[w], entries))
            for i in calls.adopted[w]:
                self._where[i] = address
            self.recoveries += len(calls.adopted[w])
        if dead:
            dead = sorted(set(dead))
            for w in dead:
                self._forget(self._workers[w])
            raise WorkerUnavailableError(
                dead, f"dask worker(s) {[self._workers[w] for w in dead]} were lost while computing chosen chunks"
            )
        return values

    def compute_on(
        self, worker: int, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int]
    ) -> list[Any]:
        """``fn`` over ``chunk_ids`` on worker ``worker``."""
        return self.run_on_workers({worker: WorkerTask(fn, payload, tuple(chunk_ids))})[worker]

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
    (``False`` sends every pass through dask's RPC, see ``engines.channel``) are the resident runner's: with a
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
