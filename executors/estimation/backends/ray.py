"""The ``ray`` chunk runner: chunks ``ray.put`` once and held by one actor per worker.

The driver puts every encoded chunk into the object store once (it owns those objects, so they
outlive any worker), and each actor resolves the ids of its contiguous block once and keeps them
resident. A data pass sends each live actor the function, the payload (pickled once per pass:
inside the call when small, through the object store when large) and its chunk ids; results come
back as one pickle per actor. When an actor dies, or is killed as a straggler (silent at the straggler
deadline while others answered), its chunks move to the survivors, which resolve them from the object
store and recompute them (same bits); a pass no actor finishes within ``timeout`` s raises ``WorkerTimeoutError``.

With ``direct_channel=True`` (the default) each actor also serves the data passes on a socket of its
own (``backends.channel``): a pass, and each placed run of the SDC audit (borrowed chunks included),
then costs a pipe-like round trip instead of two trips through Ray's task RPC. Loading chunks,
liveness and recovery stay Ray's. Work placed on chosen actors (the audit's), and a straggler given up, are
``ray_placement``.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from ....contracts.resources import local_cpu_count
from ..api import encoded_data
from ..compat.reference_handles import BuiltByEncodedData
from ..em_pass.chunks import (
    WorkerLostError,
    WorkerTimeoutError,
    apply_chunk_fn,
)
from ..handle import ChunkedEncodedData, handle_from_runner
from ..options import EncodedDataOptions
from ..sources.recipes import materialize
from .backend_declaration import refuse_for_runner
from .channel import (
    ChannelClient,
    ChannelOffer,
    ChannelServer,
    holder_key,
    wait_channels,
)
from .chunk_assignment import (
    block_assignment,
    ordered_results,
    requested_ids,
)
from .deadline import DEFAULT_TIMEOUT_S, Deadline, check_straggler_timeout, check_timeout, stragglers_to_give_up
from .optional_engine import require_engine
from .ray_loopback import loopback_ray_start, one_node_cluster
from .ray_payload import INLINE_PAYLOAD_BYTES, pack_payload, pack_payload_sized, pickled_results, ray_uses_tls
from .ray_placement import RayPlacedRuns
from .ray_tasks import RayTaskRunner, has_cluster_view
from .wire_bytes import WireBytes
from .worker_process import prepare_worker

__all__ = [
    "INLINE_PAYLOAD_BYTES", "RayChunkWorker", "RayEncodedData", "RayRunner", "pack_payload", "ray_encoded_data",
    "one_node_cluster", "ray_uses_tls",
]

_log = logging.getLogger(__name__)


class RayChunkWorker:
    """Actor body: holds resident chunks and maps functions over them."""

    def __init__(self) -> None:
        prepare_worker()
        self.chunks: dict[int, Any] = {}

    def pid(self) -> int:
        """The worker's process id (tests kill it to prove recovery)."""
        import os

        return os.getpid()

    def open_channel(self, driver_public: bytes, loopback: bool) -> tuple[tuple[str, int], bytes]:
        """Serve data passes over the resident chunks on a socket keyed by agreement with the driver's
        ``driver_public`` (see ``backends.channel``), on loopback for a one-node cluster, else on this
        actor's node address; ``(address, holder public key)``."""
        import ray

        key, public = holder_key(driver_public)
        host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        return ChannelServer(lambda i: self.chunks[i], "a ray actor").open(host, key), public

    def load(self, chunk_ids: list[int], refs: list[Any]) -> int:
        """Resolve chunk objects from the store once and keep them; returns how many it holds."""
        import ray

        for i, value in zip(chunk_ids, ray.get(list(refs))):
            self.chunks[int(i)] = materialize(value)  # a recipe (files, a dataset block) is read here
        return len(self.chunks)

    def run(self, fn: Callable[[Any, Any], Any], payload: bytes, chunk_ids: list[int]) -> bytes:
        """``fn(chunk, payload)`` for each of ``chunk_ids``: the pickled ``(chunk id, result)`` pairs
        (``payload`` comes pickled, see ``pack_payload``)."""
        return pickled_results(
            list(zip(chunk_ids, apply_chunk_fn(fn, pickle.loads(payload), chunk_ids, self.chunks.__getitem__)))
        )

    def run_any(
        self, fn: Callable[[Any, Any], Any], payload: bytes, chunk_ids: list[int], borrowed: dict[int, Any]
    ) -> bytes:
        """``fn`` over ``chunk_ids`` in order; chunks not resident here come from the store (``borrowed``
        holds their object refs, wrapped in a list so Ray passes them unresolved) and are not kept.
        Returns the pickled results."""
        import ray

        extra = {i: materialize(v) for i, v in zip(borrowed, ray.get([ref[0] for ref in borrowed.values()]))}
        return pickled_results(
            apply_chunk_fn(
                fn, pickle.loads(payload), chunk_ids, lambda i: self.chunks[i] if i in self.chunks else extra[i]
            )
        )


class RayRunner(RayPlacedRuns):
    """Chunk runner over Ray actors (a running Ray, or a local one it starts and owns)."""

    name = "ray"

    def __init__(
        self,
        num_workers: int | None = None,
        *,
        address: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        start_timeout: float | None = DEFAULT_TIMEOUT_S,
        init_kwargs: dict[str, Any] | None = None,
        num_cpus_per_worker: float | None = None,
        direct_channel: bool = True,
        straggler_timeout: float | None = None,
    ) -> None:
        ray = require_engine("ray", "ray")
        # A Ray with TLS keeps every pass on its own (encrypted) RPC: the channel is plain TCP.
        self.direct_channel = bool(direct_channel) and not ray_uses_tls()
        self._channels: dict[int, ChannelClient] = {}
        self.wire = WireBytes()
        """Pass bytes to and from the actors: channel frames, and the blobs of ``run`` calls through Ray."""
        self.timeout = check_timeout(timeout)
        self._init_stragglers(check_straggler_timeout(straggler_timeout, self.timeout))
        self.start_timeout = check_timeout(start_timeout)
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False)
            kwargs.update(init_kwargs or {})
            if address is None and "_node_ip_address" not in kwargs:
                with loopback_ray_start(ray):
                    ray.init(address=address, _node_ip_address="127.0.0.1", **kwargs)
            else:
                ray.init(address=address, **kwargs)
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        n = max(1, int(cpus)) if num_workers is None else int(num_workers)
        if n < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
        per_worker = min(1.0, cpus / n) if num_cpus_per_worker is None else float(num_cpus_per_worker)
        actor_cls = ray.remote(num_cpus=per_worker, max_restarts=0)(RayChunkWorker)
        self._actors: list[Any] = [actor_cls.remote() for _ in range(n)]
        self._alive = [True] * n
        self.num_workers = n
        self._refs: list[Any] = []
        self._owner: list[int] = []
        self.recoveries = 0
        """Chunks moved to a surviving actor after one died (for tests and logs)."""

    def worker_pids(self) -> list[int]:
        """Process ids of the live actors, in worker order."""
        import ray

        return ray.get([a.pid.remote() for a, ok in zip(self._actors, self._alive) if ok])

    # -- placement ----------------------------------------------------------------------------
    def scatter(self, chunks: Sequence[Any]) -> None:
        """``ray.put`` every chunk once and load contiguous blocks into the actors."""
        import ray

        self._refs = [ray.put(c) for c in chunks]
        self._owner = [0] * len(self._refs)
        loads = []
        for w, ids in enumerate(block_assignment(len(self._refs), self.num_workers)):
            for i in ids:
                self._owner[i] = w
            if ids:
                loads.append(self._actors[w].load.remote(ids, [self._refs[i] for i in ids]))
        self._wait(loads, "placing chunks")
        if self.direct_channel:
            self._open_channels()

    def _open_channels(self) -> None:
        """A socket per live actor for the data passes; on any failure, passes go through Ray's RPC."""
        import ray

        self._close_channels()
        live = [w for w, ok in enumerate(self._alive) if ok]
        try:
            offer = ChannelOffer()  # the key itself never crosses Ray's RPC: one is agreed per actor
            loopback = one_node_cluster(ray)
            replies = self._wait([self._actors[w].open_channel.remote(offer.public, loopback) for w in live],
                                 "opening pass channels")
            self._channels = {w: ChannelClient(where, offer.key_for(public), wire=self.wire)
                              for w, (where, public) in zip(live, replies)}
        except (OSError, ray.exceptions.RayError, WorkerTimeoutError) as exc:
            _log.warning("ray: no direct pass channel (%r); data passes go through Ray's RPC", exc)
            self._close_channels()

    def _close_channels(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels = {}

    def _wait(self, refs: list[Any], what: str) -> list[Any]:
        import ray

        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout)
        if not_ready:
            raise WorkerTimeoutError(
                f"ray actors did not finish {what} within {self.start_timeout} s; raise start_timeout= "
                "(seconds) or check that the Ray cluster has free CPUs for the actors"
            )
        return ray.get(ready)

    def _reassign(self, dead: int) -> list[int]:
        """Move the chunks of dead actors to the survivors (round robin); returns the moved ids.

        A survivor that dies while loading them is marked dead too and its chunks move as well.
        """
        import ray

        self._alive[dead] = False
        channel = self._channels.pop(dead, None)
        if channel is not None:
            channel.close()
        moved_ids: list[int] = []
        while True:
            lost = [i for i, w in enumerate(self._owner) if not self._alive[w]]
            if not lost:
                break
            survivors = [w for w, ok in enumerate(self._alive) if ok]
            if not survivors:
                raise WorkerLostError(f"every ray actor died; chunks {lost} cannot be recomputed. Restart Ray.")
            _log.warning("ray: moving chunks %s of dead actor(s) to actors %s", lost, survivors)
            moved: dict[int, list[int]] = {}
            for k, i in enumerate(lost):
                moved.setdefault(survivors[k % len(survivors)], []).append(i)
            loads = {w: self._actors[w].load.remote(ids, [self._refs[i] for i in ids]) for w, ids in moved.items()}
            ready, not_ready = ray.wait(list(loads.values()), num_returns=len(loads), timeout=self.start_timeout)
            if not_ready:
                raise WorkerTimeoutError(
                    f"ray actors did not take over chunks {lost} within {self.start_timeout} s; "
                    "raise start_timeout= (seconds) or check the Ray cluster"
                )
            for w, ref in loads.items():
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._alive[w] = False  # died too: its chunks (old and new) move next round
                    continue
                for i in moved[w]:
                    self._owner[i] = w
                moved_ids.extend(moved[w])
        self.recoveries += len(moved_ids)
        return sorted(moved_ids)

    # -- data passes --------------------------------------------------------------------------
    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]:
        """``fn(chunk, payload)`` on the actor holding each chunk; results in chunk-id order."""
        ray = require_engine("ray", "ray")
        ids = requested_ids(chunk_ids, len(self._refs))
        deadline = Deadline(self.timeout)
        if self._channels:
            task = pickled_results((fn, payload))
            if len(task) <= INLINE_PAYLOAD_BYTES:
                return self._map_direct(task, ids, deadline)
        payload_ref, payload_size = pack_payload_sized(payload)
        results: dict[int, Any] = {}
        inflight: dict[Any, tuple[int, list[int]]] = {}

        def submit(chunk_list: list[int]) -> None:
            by_worker: dict[int, list[int]] = {}
            for i in chunk_list:
                by_worker.setdefault(self._owner[i], []).append(i)
            for w, wids in sorted(by_worker.items()):
                inflight[self._actors[w].run.remote(fn, payload_ref, wids)] = (w, wids)
                self.wire.count_message_sent(payload_size)  # each actor gets the pickled payload (inline or store)

        submit(ids)
        clock = self._straggler_clock()
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=clock.wait_s(deadline.remaining()))
            if not ready and clock.due():
                owed: dict[int, list[int]] = {}
                give_up = stragglers_to_give_up({w for w, _ in inflight.values() if w in self._answered},
                                                self.worker_ids())
                for ref in [r for r, (w, _) in inflight.items() if w in give_up]:
                    w, wids = inflight.pop(ref)
                    owed.setdefault(w, []).extend(wids)
                stuck = sorted(owed)
                for w in stuck:
                    submit(self._outrun(w, owed[w]))
                clock.restart() if stuck else clock.disarm()
                continue
            if not ready and deadline.expired():
                hung = sorted({w for w, _ in inflight.values()})
                pending = sorted(i for _, wids in inflight.values() for i in wids)
                raise WorkerTimeoutError(
                    f"ray actor(s) {hung} did not return chunk(s) {pending} within {self.timeout} s; "
                    "a worker is hung or overloaded. Raise timeout= (seconds) or restart it."
                )
            for ref in ready:
                w, wids = inflight.pop(ref)
                try:
                    reply = ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._reassign(w)
                    submit(wids)  # this pass's share of the dead actor, now on survivors
                    clock.restart()  # their recomputation is a race of its own
                    continue
                self.wire.count_received(reply)
                results.update(pickle.loads(reply))
                self._answered.add(w)
                clock.answered()
        return ordered_results(results, ids, self.name)

    def _map_direct(self, task: bytes, ids: list[int], deadline: Deadline) -> list[Any]:
        """A pass over the actors' sockets; a closed socket is a dead actor, whose chunks move to the
        survivors (through Ray) and are recomputed there."""
        results: dict[int, Any] = {}

        def fail(w: int) -> list[int]:
            """Chunks actor ``w`` still owed (its socket is gone), after moving its chunks away."""
            channel = self._channels.get(w)
            owed = channel.owed if channel is not None else []
            self._reassign(w)
            return owed

        def submit(chunk_list: list[int]) -> None:
            by_worker: dict[int, list[int]] = {}
            for i in chunk_list:
                by_worker.setdefault(self._owner[i], []).append(i)
            for w, wids in sorted(by_worker.items()):
                channel = self._channels.get(w)
                if channel is None or not channel.send(task, wids):
                    submit(fail(w) + wids)

        submit(ids)
        clock = self._straggler_clock()
        while any(channel.waiting for channel in self._channels.values()):
            ready = wait_channels(self._channels, clock.wait_s(deadline.remaining()))
            if not ready and clock.due():
                stuck = stragglers_to_give_up(
                    sorted(w for w, ch in self._channels.items() if ch.waiting and w in self._answered),
                    self.worker_ids())
                for w in stuck:
                    submit(self._outrun(w, self._channels[w].owed))
                clock.restart() if stuck else clock.disarm()
                continue
            if not ready and deadline.expired():
                hung = sorted(w for w, channel in self._channels.items() if channel.waiting)
                pending = sorted(i for w in hung for i in self._channels[w].owed)
                raise WorkerTimeoutError(
                    f"ray actor(s) {hung} did not return chunk(s) {pending} within {self.timeout} s; "
                    "a worker is hung or overloaded. Raise timeout= (seconds) or restart it."
                )
            for w in ready:
                channel = self._channels.get(w)
                if channel is None:  # its actor was given up while an earlier reply was handled
                    continue
                got = channel.receive()
                if got is None:  # the actor's socket closed: it died
                    submit(fail(w))
                    clock.restart()  # the survivors' recomputation is a race of its own
                    continue
                wids, values = got
                results.update(zip(wids, values))
                self._answered.add(w)
                clock.answered()
        return ordered_results(results, ids, self.name)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the actors, drop the chunk objects; shut Ray down when this runner started it."""
        ray = require_engine("ray", "ray")
        self._close_channels()
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._actors, self._refs = [], []
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False


def ray_encoded_data(data: Any, *, num_workers: int | None = None, address: str | None = None,
                     client: str | None = None, **params: Any) -> Any:
    """``encoded_data(..., backend="ray")``: a handle over a :class:`RayRunner`.

    ``address`` (mixle passes it as ``client=``) is the Ray cluster; ``timeout`` bounds each data pass,
    ``start_timeout`` the actors' start and chunk placement; ``init_kwargs`` go to ``ray.init`` when no
    Ray is running yet (the runner then owns it); ``direct_channel=False`` sends every data pass through
    Ray's RPC (see ``backends.channel``). A Ray module without a cluster view gets the task runner, which
    honours ``num_workers``, ``address`` and ``init_kwargs`` only. ``params`` are the handle's options.
    """
    if client is not None and address is not None and client != address:
        raise ValueError(f"client={client!r} and address={address!r} both name the Ray cluster; give one")
    engine: dict[str, Any] = {k: params.pop(k) for k in ("timeout", "start_timeout", "init_kwargs", "direct_channel",
                                                         "straggler_timeout") if k in params}
    runner = _runner(num_workers, address=address if address is not None else client, **engine)
    try:
        return handle_from_runner(runner, data, handle_class=RayEncodedData, **params)
    except BaseException:
        runner.close()
        raise


def _runner(num_workers: int | None, *, address: str | None = None, init_kwargs: dict[str, Any] | None = None,
            **options: Any) -> RayRunner | RayTaskRunner:
    """The actor runner on a real Ray; the task runner on a Ray module without a cluster view (mixle's minimum)."""
    ray = require_engine("ray", "ray")
    if has_cluster_view(ray):
        return RayRunner(num_workers, address=address, init_kwargs=init_kwargs, **options)
    refuse_for_runner("ray", options, "a Ray module without cluster_resources", "a Ray cluster (ray.init)")
    return RayTaskRunner(ray, num_workers=num_workers, address=address, init_kwargs=init_kwargs)


class RayEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """Our ray handle under mixle's name: ``encoded_data(..., backend="ray")`` returns one, and mixle's
    ``RayEncodedData(data, estimator, model, encoder, num_partitions, num_workers, address)`` is that call
    (``num_partitions`` the chunks; the option check, admission gate and audit included)."""

    backend_name = "ray"

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, model: Any = None, encoder: Any = None,
               num_partitions: int | None = None, num_workers: int | None = None, address: str | None = None,
               **options: Any) -> Any:
        if address is not None:
            options["address"] = address
        return encoded_data(data, estimator=estimator, model=model, encoder=encoder, num_chunks=num_partitions,
                            num_workers=num_workers, backend="ray", **options)

    @property
    def num_chunks(self) -> int:
        """Chunks the data is cut into (0 once closed, as mixle's handle reports)."""
        return 0 if self._closed else len(self.bounds)


ENCODED_DATA_OPTIONS = frozenset({"num_workers", "address", "client", "timeout", "start_timeout", "init_kwargs",
                                  "direct_channel", "straggler_timeout", "batch_size", "shuffle", "seed"})
"""The ``encoded_data`` options the ray backend honours besides the handle's own."""

WORKER_PROCESSES = True


def planned_workers(options: EncodedDataOptions) -> int:
    """``num_workers``, else the running Ray's CPUs, else the local CPUs."""
    ray = require_engine("ray", "ray")
    if options.num_workers is not None:
        return int(options.num_workers)
    if not has_cluster_view(ray):
        return 1  # the task runner: RayTaskRunner(num_workers=None) counts one worker
    if ray.is_initialized():
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    return local_cpu_count()
