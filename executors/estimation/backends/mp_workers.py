"""The ``mp`` runner's worker processes: what runs in them, and their start, liveness and stop.

A worker attaches the shared block of encoded chunks (or reads its own chunks from their recipes) and answers
``map`` requests over its pipe until ``close`` (:func:`_worker_main`). :class:`MPWorkerProcesses` (a base of
``MPChunkRunner``) starts them with BLAS capped to its threads and without re-running the user's main module,
waits for their start-up reports, drops a dead or given-up one, and stops them all and frees the block.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from ..em_pass.chunks import EncodedChunk, WorkerLostError, WorkerTimeoutError, apply_chunk_fn
from .main_guard import dumps_for_workers, main_left_out
from .mp_layout import rebuild_arrays
from .recipe_store import RecipeStore
from .worker_process import keep_freed_memory, yield_on_wakeup

__all__ = ["BLAS_THREAD_VARIABLES", "MPWorker", "MPWorkerProcesses"]

BLAS_THREAD_VARIABLES = (
    "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS",
)
"""Environment variables set to ``1`` in every worker so workers do not oversubscribe cores."""

_ENV_LOCK = threading.Lock()


# ---- worker process ------------------------------------------------------------------------------
def _serve(conn: Any, chunks: Any) -> None:
    """Answer ``("map", fn, payload, ids[, home])`` requests over ``chunks`` until ``close``; ``home`` (recipes
    only) names the chunks this worker keeps from now on."""
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            message = conn.recv_bytes()
        except EOFError:
            return
        kind, *rest = pickle.loads(message)
        if kind == "close":
            return
        fn, payload, ids, *home = rest
        if home and home[0] is not None:
            chunks.set_home(home[0])
        try:
            out = list(zip(ids, apply_chunk_fn(fn, payload, ids, chunks.__getitem__)))
        except BaseException as exc:  # noqa: BLE001 - reported to the driver with the traceback
            conn.send_bytes(pickle.dumps(("error", getattr(exc, "chunk_id", ids), traceback.format_exc())))
        else:
            conn.send_bytes(dumps_for_workers(("ok", out)))


def _worker_main(conn: Any, shm_name: str | None, layout: bytes) -> None:
    """Worker loop: attach the shared block (or take the chunks' recipes, ``shm_name`` None: this worker
    reads its own chunks), then answer ``map`` requests until ``close``. A start that fails is reported
    with its traceback (the driver names the cause in its ``WorkerLostError``)."""
    keep_freed_memory()  # BLAS threads are capped through the environment the worker was started with
    yield_on_wakeup()
    if shm_name is None:
        try:
            store = RecipeStore(pickle.loads(layout))
        except BaseException:  # noqa: BLE001 - the driver names the cause in its WorkerLostError
            conn.send_bytes(pickle.dumps(("failed", traceback.format_exc())))
            return
        _serve(conn, store)
        return
    try:
        shm = SharedMemory(name=shm_name)
        assert shm.buf is not None  # an attached block is open until close()
        chunks = [EncodedChunk(c, a, b, rebuild_arrays(d, shm.buf)) for c, a, b, d in pickle.loads(layout)]
    except BaseException:  # noqa: BLE001 - the driver names the cause in its WorkerLostError
        conn.send_bytes(pickle.dumps(("failed", traceback.format_exc())))
        return
    try:
        _serve(conn, chunks)
    finally:
        chunks = []  # noqa: F841 - drop the views before closing the block
        try:
            shm.close()
        except BufferError:  # pragma: no cover - a view escaped; the OS frees it at exit
            pass


class MPWorker:
    """One worker process as the driver sees it: its index, process, pipe, the chunk ids it owes, its home."""

    __slots__ = ("index", "process", "conn", "pending", "home")

    def __init__(self, index: int, process: Any, conn: Any) -> None:
        self.index, self.process, self.conn = index, process, conn
        self.pending: list[int] = []
        self.home: tuple[int, ...] | None = None
        """The chunks this worker was last told to keep (recipes only)."""


class MPWorkerProcesses:
    """The worker processes of an ``mp`` runner (a base of ``MPChunkRunner``; module doc)."""

    num_workers: int
    start_timeout: float
    shutdown_timeout: float
    blas_threads: int
    _ctx: BaseContext  # the multiprocessing context of the chosen start method
    _workers: list[MPWorker]
    _shm: SharedMemory | None
    _answered: set[int]

    def _spawn(self, indices: Sequence[int], layout: bytes) -> list[MPWorker]:
        """Start worker processes ``indices`` on the shared block or the recipes (not yet waited for). They never
        run the user's main module: spawn/forkserver get none to re-run, and what it defines travels by value."""
        spawned = self._ctx.get_start_method() != "fork"  # a forked child runs nothing of the script again
        started: list[MPWorker] = []
        self._answered.difference_update(indices)
        with _ENV_LOCK, main_left_out() if spawned else contextlib.nullcontext():
            # children inherit the environment at start: cap BLAS threads there
            saved = {k: os.environ.get(k) for k in BLAS_THREAD_VARIABLES}
            os.environ.update({k: str(self.blas_threads) for k in BLAS_THREAD_VARIABLES})
            try:
                for i in indices:
                    parent, child = self._ctx.Pipe(duplex=True)
                    proc = self._ctx.Process(  # type: ignore[attr-defined]  # get_context(str) -> BaseContext
                        target=_worker_main, args=(child, None if self._shm is None else self._shm.name, layout),
                        name=f"mixle-em-mp-{i}", daemon=True,
                    )
                    proc.start()
                    child.close()
                    started.append(MPWorker(i, proc, parent))
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        return started

    def _await_ready(self, w: MPWorker, deadline: float) -> None:
        """Wait for worker ``w``'s start-up report; a worker that failed or died names the cause."""
        if not w.conn.poll(max(deadline - time.monotonic(), 0.0)):
            raise WorkerTimeoutError(
                f"mp worker {w.index} did not start within {self.start_timeout:.0f} s; the machine may "
                "be overloaded: raise start_timeout= or lower num_workers="
            )
        try:
            reply = pickle.loads(w.conn.recv_bytes())
        except EOFError:
            w.process.join(timeout=5)
            raise WorkerLostError(
                f"mp worker {w.index} exited during start-up (exit code {w.process.exitcode}) before it could "
                "report a cause: killed by the system (memory?) or its interpreter failed to start; see its stderr"
            ) from None
        if reply[0] == "failed":
            cause = reply[1].strip().splitlines()[-1]
            raise WorkerLostError(f"mp worker {w.index} failed to load the encoded chunks: {cause}\n{reply[1]}")

    def _start_workers(self, layout: bytes) -> None:
        self._workers.extend(self._spawn(range(self.num_workers), layout))
        deadline = time.monotonic() + self.start_timeout
        for w in self._workers:
            self._await_ready(w, deadline)

    @property
    def live_workers(self) -> list[int]:
        """Indices of workers still alive."""
        return [w.index for w in self._workers if w.process.is_alive()]

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers, in worker order."""
        return [w.process.pid for w in self._workers if w.process.is_alive()]

    def _drop(self, worker: MPWorker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=5)
        try:
            worker.conn.close()
        except OSError:  # pragma: no cover
            pass
        self._workers.remove(worker)

    # -- stop -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers and free the shared block (idempotent)."""
        for w in list(self._workers):
            try:
                w.conn.send_bytes(pickle.dumps(("close",)))
            except (OSError, ValueError):
                pass
        for w in list(self._workers):
            w.process.join(timeout=self.shutdown_timeout)
            self._drop(w)
        if self._shm is not None:
            try:
                self._shm.close()
                self._shm.unlink()
            except (FileNotFoundError, BufferError):  # pragma: no cover
                pass
            self._shm = None
