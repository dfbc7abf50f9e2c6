"""Start a real gloo world from the project's one spawner and run a rank-agnostic body in every rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mixle_parallel.verification.harness.mesh import MeshError
from mixle_parallel.verification.harness.mesh import run_world as spawn_world

PRELOAD = ["torch", "torch.distributed", "megatron.core.parallel_state"]
"""Children fork from a server that imported these once, so each world starts in seconds."""


def run_world(world: int, body: Callable[..., Any], *args: Any, timeout: float = 600.0) -> list[Any]:
    """Run ``body(rank, world, *args)`` in ``world`` gloo processes with torchrun's variables; per-rank results."""
    try:
        return spawn_world(body, world, *args, timeout=timeout, start_method="forkserver", preload=PRELOAD,
                           torchrun_env=True, group_timeout_s=240.0, backend="gloo")
    except MeshError as err:
        raise AssertionError(str(err)) from None
