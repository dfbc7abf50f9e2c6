"""Start a real gloo world once and run a rank-agnostic body in every rank (test helper)."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from typing import Any, Callable

# Children fork from a server that imported these once, so each world starts in seconds.
PRELOAD = ["torch", "torch.distributed", "megatron.core.parallel_state"]


def free_port() -> int:
    """A TCP port the OS reports free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(rank: int, world: int, port: int, body: Callable[..., Any], args: tuple, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=__import__("datetime").timedelta(seconds=240))
        queue.put((rank, "ok", body(rank, world, *args)))
    except BaseException:  # report every failure with its traceback to the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(world: int, body: Callable[..., Any], *args: Any, timeout: float = 600.0) -> list[Any]:
    """Run ``body(rank, world, *args)`` in ``world`` gloo processes; return the per-rank results."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, world, port, body, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            rank, status, value = queue.get(timeout=timeout)
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"rank {rank} failed:\n{value}")
                break
    finally:
        for p in procs:
            p.join(timeout=30 if not errors else 5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
