"""The one process-world spawner: N processes in one torch.distributed process group, results by rank.

Every multi-process world of the project starts here: the harness's verification meshes, the demo's
training ranks, the benchmarks' and the tests' worlds. ``run_world(fn, world_size, *args)`` runs
``fn(rank, world_size, *args)`` in every rank of a fresh process group (gloo on CPU; NCCL for CUDA
tensors when every rank has a GPU) and returns the per-rank results in rank order; a failing rank
raises ``MeshError`` with its traceback. Ranks rendezvous through a FileStore in a private folder
(no ports), or through ``env://`` on a free local port with torchrun's variables set
(``torchrun_env=True``, for libraries that read them). A rank may send progress to the parent with
``report(message)``; the parent hands it to ``on_message(rank, message)`` while it waits.
``run_on_gloo_mesh`` is the harness's form (flight recorder on); the ranks' trials are admitted by
the harness capability that ``worker.run_trials`` enters in each rank, never by the environment.

The function and its arguments cross the process boundary with multiprocessing's usual transport,
so they must be importable module-level objects (start methods ``spawn`` and ``forkserver``
re-import ``__main__``: keep scripts behind ``if __name__ == "__main__":``). Results travel as plain
pickles (tensors by value, never torch's shared-memory handles, which die with the rank). Process
groups are always destroyed and processes always reaped, whatever happens.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ...contracts import comm_backend_for

__all__ = [
    "DEFAULT_TIMEOUT_S", "MeshError", "fresh_process_group", "mesh_kind", "process_group_backend", "report",
    "run_on_gloo_mesh", "run_world",
]

STORE_DIR_ENV = "MIXLE_PARALLEL_MESH_STORE_DIR"
"""Set in every rank: a private folder for FileStore files (fresh process groups need new ones)."""

BACKEND_ENV = "MIXLE_PARALLEL_MESH_BACKEND"
"""Overrides the process-group backend every rank picks (e.g. ``gloo`` on a GPU machine)."""

DEFAULT_TIMEOUT_S = 300.0
"""Generous default: process start and gloo rendezvous are slow on a loaded machine."""

START_METHODS = ("spawn", "forkserver")
"""Start methods that give each rank a fresh interpreter (``fork`` would copy the parent's threads)."""

_REPORT_QUEUE: Any = None
_REPORT_RANK: int | None = None


class MeshError(RuntimeError):
    """A rank of a process world failed or timed out; the message carries its traceback."""


def process_group_backend(world_size: int) -> str:
    """``cpu:gloo,cuda:nccl`` with one CUDA device per rank (NCCL for device tensors), else plain ``gloo``.

    Call it inside a rank (it asks torch about CUDA); ``MIXLE_PARALLEL_MESH_BACKEND`` overrides it.
    """
    forced = os.environ.get(BACKEND_ENV)
    if forced:
        return forced
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def mesh_kind(world_size: int) -> tuple[str, str]:
    """(device kind, communication backend) a harness mesh of ``world_size`` ranks runs on: what certificates
    record (``cuda``/``nccl`` when every rank has a GPU, else ``cpu``/``gloo``; ``MIXLE_PARALLEL_MESH_BACKEND``
    overrides). An executor that starts its own workers is measured where it runs (``launch.SelfLaunch``)."""
    device = "cuda" if "nccl" in process_group_backend(world_size) else "cpu"
    return device, comm_backend_for(device)


def _init_group(rank: int, world_size: int, store_path: str | None, group_timeout_s: float | None) -> None:
    import torch
    import torch.distributed as dist

    backend = process_group_backend(world_size)
    os.environ["LOCAL_RANK"] = str(rank)  # executors pick cuda:LOCAL_RANK; every rank of a world is local
    if "nccl" in backend:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    extra: dict[str, Any] = {} if group_timeout_s is None else {"timeout": timedelta(seconds=group_timeout_s)}
    init_method = "env://" if store_path is None else f"file://{store_path}"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, **extra)


def report(message: Any) -> None:
    """Inside a rank: send ``message`` (picklable) to the parent's ``on_message(rank, message)``.

    Outside a world started by this module it does nothing, so rank code can call it unconditionally.
    """
    if _REPORT_QUEUE is not None:
        _REPORT_QUEUE.put((_REPORT_RANK, "message", pickle.dumps(message)))


def _rank_main(rank: int, world_size: int, store_path: str | None, fn: Callable[..., Any], args: tuple[Any, ...],
               results: Any, env: dict[str, str], group_timeout_s: float | None) -> None:
    global _REPORT_QUEUE, _REPORT_RANK
    os.environ.update(env)
    _REPORT_QUEUE, _REPORT_RANK = results, rank
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        _init_group(rank, world_size, store_path, group_timeout_s)
        try:
            value = fn(rank, world_size, *args)
            results.put((rank, "result", pickle.dumps(value)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        results.put((rank, "error", traceback.format_exc()))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_env(base: dict[str, str], rank: int, world_size: int, port: int | None) -> dict[str, str]:
    if port is None:
        return base
    return {**base, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _check_arguments(world_size: int, start_method: str, timeout: float) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r}; use one of {', '.join(START_METHODS)}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")


def _exit_hint(codes: dict[int, int | None]) -> str:
    if any(code == 1 for code in codes.values()):
        return ("; a rank that dies at start-up often failed to re-import the launching script: keep its top "
                "level behind `if __name__ == \"__main__\":` and pass module-level functions")
    return ""


def _collect(procs: Sequence[Any], results: Any, world_size: int, timeout: float,
             on_message: Callable[[int, Any], None] | None) -> tuple[dict[int, Any], str | None]:
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    grace: float | None = None
    while len(collected) < world_size:
        try:
            rank, kind, payload = results.get(timeout=0.5)
        except queue.Empty:
            now = time.monotonic()
            dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in collected]
            if dead:
                grace = grace or now + 5.0  # its result may still be in the pipe
                if now > grace:
                    codes = {r: procs[r].exitcode for r in dead}
                    return collected, f"ranks {dead} exited (exit codes {codes}) without a result{_exit_hint(codes)}"
            elif now > deadline:
                missing = sorted(set(range(world_size)) - set(collected))
                return collected, f"ranks {missing} produced no result within {timeout:.0f}s"
            continue
        if kind == "error":
            return collected, f"rank {rank} failed:\n{payload}"
        if kind == "message":
            if on_message is not None:
                on_message(rank, pickle.loads(payload))
            continue
        collected[rank] = pickle.loads(payload)
    return collected, None


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    start_method: str = "spawn",
    preload: Sequence[str] = (),
    torchrun_env: bool = False,
    group_timeout_s: float | None = None,
    backend: str | None = None,
    on_message: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on a fresh ``world_size``-rank process group; results by rank.

    ``timeout`` bounds the whole run; ``env`` is added to every rank's environment (``OMP_NUM_THREADS=1``
    unless given); ``preload`` names modules
    a ``forkserver`` imports once for all ranks (fast starts); ``torchrun_env`` sets RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT and joins through ``env://``;
    ``group_timeout_s`` is the process group's collective timeout (torch's default when None);
    ``backend`` forces the process-group backend (default: ``process_group_backend`` in each rank).
    """
    _check_arguments(world_size, start_method, timeout)
    context: Any = multiprocessing.get_context(start_method)  # a SpawnContext or ForkServerContext
    if preload:
        if start_method != "forkserver":
            raise ValueError("preload= needs start_method='forkserver'")
        context.set_forkserver_preload(list(preload))
    results = context.Queue()
    child_env = {"OMP_NUM_THREADS": "1", **(env or {})}
    if backend is not None:
        child_env[BACKEND_ENV] = backend
    port = _free_port() if torchrun_env else None
    with tempfile.TemporaryDirectory(prefix="mixle-world-") as folder:
        store = None if torchrun_env else os.path.join(folder, "store")
        child_env[STORE_DIR_ENV] = folder
        procs = [context.Process(target=_rank_main, daemon=False, args=(
            r, world_size, store, fn, args, results, _rank_env(child_env, r, world_size, port), group_timeout_s))
            for r in range(world_size)]
        for proc in procs:
            proc.start()
        failure: str | None = None
        try:
            collected, failure = _collect(procs, results, world_size, timeout, on_message)
        finally:
            for proc in procs:
                proc.join(timeout=5 if failure else 60)
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(timeout=10)
            results.close()
        if failure:
            raise MeshError(f"process world of {world_size} ranks: {failure}")
    return [collected[r] for r in range(world_size)]


def run_on_gloo_mesh(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """The harness's mesh: ``run_world`` with torch's flight recorder on (traced collectives)."""
    return run_world(fn, world_size, *args, timeout=timeout, env={"TORCH_FR_BUFFER_SIZE": "20000", **(env or {})})


def fresh_process_group(index: int) -> None:
    """Inside a FileStore world's rank: replace the default process group by a new one (a fresh rendezvous)."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    _init_group(rank, world_size, os.path.join(os.environ[STORE_DIR_ENV], f"store-{index}"), None)
