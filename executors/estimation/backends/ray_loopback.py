"""Start a local Ray whose every server listens on loopback only (the ``ray`` engine's own start), and
tell whether a running Ray is one node (its pass channels then bind loopback only).

Split from ``ray`` (the runner); ``loopback_ray_start`` is used only where we call ``ray.init`` without an address.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["loopback_ray_start", "one_node_cluster"]

_SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def loopback_ray_start(ray: Any) -> Iterator[None]:
    """While a local Ray starts: every server it starts (GCS, raylet, workers, agents) listens on 127.0.0.1.

    Ray replaces a node IP of 127.0.0.1 with the machine's reachable address unless clustering is off
    (its ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read by every Ray process at import: the processes Ray
    starts inherit it, the driver's already-read flag is set for the start). Both are restored afterwards.
    """
    constants = sys.modules.get("ray._private.ray_constants")
    before_env, before_flag = os.environ.get(_SINGLE_NODE_ENV), getattr(constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_SINGLE_NODE_ENV] = "0"
    if constants is not None:
        setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010 - a private module, no stubs
    try:
        yield
    finally:
        if before_env is None:
            os.environ.pop(_SINGLE_NODE_ENV, None)
        else:
            os.environ[_SINGLE_NODE_ENV] = before_env
        if constants is not None:
            setattr(constants, "ENABLE_RAY_CLUSTER", before_flag)  # noqa: B010


def one_node_cluster(ray: Any) -> bool:
    """Whether every alive Ray node is this driver's node (pass channels then bind loopback only)."""
    try:
        alive = [n for n in ray.nodes() if n.get("Alive", n.get("alive", False))]
        here = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - unknown topology: use the node address, as for a multi-node cluster
        return False
    return len(alive) == 1 and alive[0].get("NodeManagerAddress") == here
