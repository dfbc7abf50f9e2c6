"""What runs inside a dask worker for the ``dask`` runner, and the messages it is sent.

:class:`DaskChunkHolder` is the actor that keeps a worker's chunks resident and maps chunk
functions over them (through dask's RPC, or over its direct pass channel); ``pack_for_holder`` / ``work_for_holder``
are the one-pickle forms the runner sends it; :func:`dask_config_for_em` sets up a cluster the
runner starts. Split from ``backends.dask`` (the driver side) to keep each module to one job.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from ..sources.recipes import materialize
from .channel import ChannelServer, answer, holder_key
from .worker_process import prepare_worker, yield_on_wakeup

__all__ = ["DaskChunkHolder", "dask_config_for_em", "pack_for_holder", "work_for_holder"]


def pack_for_holder(value: Any, task: bool = False) -> bytes:
    """``value`` as one in-band pickle: dask would send every small numpy array of a chunk's statistics
    as a frame of its own (one bytes frame per call keeps a pass to a single cheap message), and
    would hand a worker chunk arrays that point into its network buffers (see ``DaskChunkHolder.load``).
    A task ``(fn, payload)`` goes through cloudpickle (functions of ``__main__`` or of modules
    registered by value must travel by value: workers cannot import them); results through plain
    pickle (fast), cloudpickle only for what it cannot do."""
    import cloudpickle

    if task:
        return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def work_for_holder(chunk_ids: list[int], keep: Sequence[int] = ()) -> bytes:
    """The chunk ids of one ``DaskChunkHolder.run`` call (and the borrowed ones to keep), as one pickle."""
    return pickle.dumps((list(chunk_ids), list(keep)), protocol=pickle.HIGHEST_PROTOCOL)


class DaskChunkHolder:
    """Actor body: the chunks resident on one dask worker, and ``fn`` mapped over them."""

    def __init__(self, prepare: bool = False) -> None:
        """``prepare`` (a cluster the runner started): set the worker process up for numeric passes
        (``prepare_worker``), on every worker that holds chunks, replacement workers included."""
        if prepare:
            prepare_worker()
        self._batch_threads: set[int] | None = set() if prepare else None
        self.chunks: dict[int, Any] = {}

    def _yield_on_wakeup(self) -> None:
        """Batch-schedule the thread that runs this call (the policy is per thread on Linux)."""
        if self._batch_threads is not None:
            import threading

            ident = threading.get_ident()
            if ident not in self._batch_threads:
                self._batch_threads.add(ident)
                yield_on_wakeup()

    def pid(self) -> int:
        """The worker's process id (tests kill it to prove recovery)."""
        import os

        return os.getpid()

    def open_channel(self, driver_public: bytes, host: str) -> tuple[tuple[str, int], bytes] | str:
        """Serve data passes over the resident chunks on a socket at ``host``, keyed by agreement with
        the driver's ``driver_public`` (see ``backends.channel``): ``(address, holder public key)``, or
        why not (the runner then keeps passes on dask's RPC)."""
        server = ChannelServer(lambda i: self.chunks[i], "a dask worker's chunk holder",
                               batch_schedule=self._batch_threads is not None)
        try:
            key, public = holder_key(driver_public)
            return server.open(host, key), public
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def load(self, chunks: dict[int, bytes], replace: bool = False) -> int:
        """Keep ``chunks`` (chunk id -> pickled chunk, or its recipe: built here) resident; ``replace`` drops
        those held before.

        Unpickling here gives every array memory of its own: arrays dask deserializes zero-copy sit
        at arbitrary offsets of a network frame (measured: not even 8-byte aligned), where numpy
        takes slow paths -- an E-step pass ran about 25% slower on them. Returns how many it holds.
        """
        if replace:
            self.chunks = {}
        self.chunks.update((int(i), materialize(pickle.loads(c))) for i, c in chunks.items())
        return len(self.chunks)

    def run(self, task: bytes, work: bytes, borrowed: dict[int, bytes] | None = None) -> bytes:
        """``fn(chunk, payload)`` over the chunk ids in order (through ``apply_chunk_fn``), ``task`` being
        the pickled ``(fn, payload)`` and ``work`` the pickled ``(chunk ids, keep)``.

        Both travel as bytes: dask serializes a list argument item by item (measured: a 24-id list
        added ~0.5 ms to every call, 72 ids ~1.3 ms). Chunks not resident here come pickled in
        ``borrowed``; those listed in ``keep`` stay resident (their holder died), the others are
        dropped after the call. Returns the pickled ``("ok", results)``, or ``("raised", exception)``
        when ``fn`` raised, so the driver can tell a failing ``fn`` from a lost worker (any exception
        of the call itself means the worker is gone).
        """
        self._yield_on_wakeup()
        chunk_ids, keep = pickle.loads(work)
        return answer(task, chunk_ids, borrowed or {}, lambda i: self.chunks[i], "a dask worker's chunk holder",
                      adopt=lambda extra: self.chunks.update((i, extra[i]) for i in keep))


def dask_config_for_em() -> Any:
    """Dask settings for workers this runner starts: numeric passes at full speed.

    Dask's default ``MALLOC_TRIM_THRESHOLD_=65536`` makes every large numpy temporary a fresh
    ``mmap`` (page faults on each E-step), and its statistical profiler samples the task thread
    every 10 ms; measured together they made a worker's E-step about 3x slower than the same call
    in the driver. BLAS stays capped to one thread per worker.

    The periodic housekeeping of an idle 2-worker cluster (the 20 ms event-loop tick, the 100 ms
    memory monitor and work-stealing balance, the 500 ms system monitor) took 12-16% of one core
    here, taken from the workers' cores during every pass; at 1 s / 1 s / off / 5 s it takes about
    1.5%. Work stealing has nothing to move (the chunk holders are pinned actors), and a worker
    over its memory limit is still stopped, within a second instead of 100 ms.
    """
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    return dask.config.set({
        "distributed.nanny.pre-spawn-environ": environ,
        "distributed.worker.profile.enabled": False,
        "distributed.admin.tick.interval": "1s",
        "distributed.worker.memory.monitor-interval": "1s",
        "distributed.scheduler.work-stealing": False,
        "distributed.admin.system-monitor.interval": "5s",
    })
