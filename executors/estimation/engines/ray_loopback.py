"""Start a local Ray whose every server listens on loopback only (the ``ray`` engine's own start).

Split from ``ray`` (the runner); used only where we call ``ray.init`` without an address.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["loopback_ray_start"]

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
