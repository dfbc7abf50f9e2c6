"""A real multi-process test base: N gloo ranks from the project's one spawner, a scenario function in each."""

from __future__ import annotations

import importlib
from typing import Any

from mixle_parallel.verification.harness.mesh import MeshError
from mixle_parallel.verification.harness.mesh import run_world as spawn_world

WORLD_TIMEOUT_S = 1200.0
"""A whole scenario world (start, rendezvous, every case) on a loaded 2-core machine."""


def _call_scenario(rank: int, world_size: int, module: str, function: str) -> Any:
    return getattr(importlib.import_module(module), function)()


def run_world(world_size: int, module: str, function: str, backend: str = "gloo") -> list[Any]:
    """Run ``module.function()`` on ``world_size`` ranks (FileStore rendezvous); return each rank's result."""
    try:
        return spawn_world(_call_scenario, world_size, module, function, timeout=WORLD_TIMEOUT_S,
                           backend=backend, group_timeout_s=300.0)
    except MeshError as err:
        raise AssertionError(f"a rank failed: {err}") from None
