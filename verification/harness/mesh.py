"""Start a real small mesh: N spawned processes in one process group (gloo on CPU; NCCL for CUDA tensors when
every rank has a GPU), joined through a FileStore (no ports).

``run_on_gloo_mesh(fn, world_size, *args)`` runs ``fn(rank, world_size, *args)`` in every rank,
returns the per-rank results in rank order, and raises ``MeshError`` with the failing rank's
traceback. The function and its arguments cross the process boundary with multiprocessing's
usual transport, so they must be importable module-level objects. Process groups are always
destroyed and processes always reaped, whatever happens.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from mixle_parallel.verification.admission import VERIFYING_ENV

STORE_DIR_ENV = "MIXLE_PARALLEL_MESH_STORE_DIR"
"""Set in every rank: a private folder for FileStore files (fresh process groups need new ones)."""

DEFAULT_TIMEOUT_S = 300.0
"""Generous default: process start and gloo rendezvous are slow on a loaded machine."""


class MeshError(RuntimeError):
    """A rank of the verification mesh failed or timed out; the message carries its traceback."""


def process_group_backend(world_size: int) -> str:
    """``cpu:gloo,cuda:nccl`` with one CUDA device per rank (NCCL for device tensors), else plain ``gloo``.

    Call it inside a rank (it asks torch about CUDA); ``MIXLE_PARALLEL_MESH_BACKEND`` overrides it.
    """
    forced = os.environ.get("MIXLE_PARALLEL_MESH_BACKEND")
    if forced:
        return forced
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def _init_group(rank: int, world_size: int, store_path: str) -> None:
    import torch
    import torch.distributed as dist

    backend = process_group_backend(world_size)
    os.environ["LOCAL_RANK"] = str(rank)  # executors pick cuda:LOCAL_RANK; every mesh rank is local
    if "nccl" in backend:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size)


def _worker(rank: int, world_size: int, store_path: str, fn: Callable[..., Any], args: tuple[Any, ...],
            results: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        _init_group(rank, world_size, store_path)
        try:
            value = fn(rank, world_size, *args)
            results.put((rank, True, value))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        results.put((rank, False, traceback.format_exc()))


def run_on_gloo_mesh(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    verifying: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on a fresh ``world_size``-rank gloo mesh; results by rank."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child_env = {"OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "20000", **(env or {})}
    if verifying:
        child_env[VERIFYING_ENV] = "1"
    with tempfile.TemporaryDirectory(prefix="mixle-mesh-") as folder:
        store = os.path.join(folder, "store")
        child_env[STORE_DIR_ENV] = folder
        procs = [context.Process(target=_worker, args=(r, world_size, store, fn, args, results, child_env),
                                 daemon=True) for r in range(world_size)]
        for proc in procs:
            proc.start()
        collected: dict[int, Any] = {}
        failure: str | None = None
        deadline = time.monotonic() + timeout
        grace: float | None = None
        try:
            while len(collected) < world_size and failure is None:
                try:
                    rank, ok, value = results.get(timeout=0.5)
                except queue.Empty:
                    now = time.monotonic()
                    dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in collected]
                    if dead:
                        grace = grace or now + 5.0  # its result may still be in the pipe
                        if now > grace:
                            codes = {r: procs[r].exitcode for r in dead}
                            failure = f"ranks {dead} exited (exit codes {codes}) without a result"
                    elif now > deadline:
                        missing = sorted(set(range(world_size)) - set(collected))
                        failure = f"ranks {missing} produced no result within {timeout:.0f}s"
                    continue
                if not ok:
                    failure = f"rank {rank} failed:\n{value}"
                else:
                    collected[rank] = value
        finally:
            for proc in procs:
                proc.join(timeout=5 if failure else 60)
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(timeout=10)
            results.close()
        if failure:
            raise MeshError(f"verification mesh of {world_size} ranks: {failure}")
    return [collected[r] for r in range(world_size)]


def fresh_process_group(index: int) -> None:
    """Inside a mesh rank: replace the default gloo process group by a new one (a fresh rendezvous)."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    _init_group(rank, world_size, os.path.join(os.environ[STORE_DIR_ENV], f"store-{index}"))
