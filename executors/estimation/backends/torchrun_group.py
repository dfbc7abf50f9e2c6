"""torch's default process group as the ``torchrun`` EM backend makes it: from torchrun's variables, gloo on CPU
(nccl where CUDA is), the handle's ``timeout=``, destroyed when the interpreter exits.

Shared by the runner and by the admission agreement of a launched EM run (``admission.em_agreement``), which
needs the group before the handle exists; whichever comes first makes it and the other finds it.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta

from .optional_engine import require_engine

__all__ = ["init_default_group", "torchrun_variables"]


def torchrun_variables() -> bool:
    """Whether torchrun's rank variables (``RANK`` and ``WORLD_SIZE``) are set for this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_default_group(backend: str | None, timeout: float | None) -> None:
    """Initialize the default process group from torchrun's variables (``backend`` None: nccl where CUDA is, else
    gloo; ``timeout`` None: torch's default), destroyed at exit (the group serves every later handle of this job:
    a re-rendezvous per handle races under torchrun)."""
    dist = require_engine("torch.distributed", "torch")
    torch = require_engine("torch", "torch")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
    kwargs = {} if timeout is None else {"timeout": timedelta(seconds=float(timeout))}
    dist.init_process_group(backend=backend, **kwargs)
    from ...torch.device_mesh import destroy_default_group  # torch is loaded by now

    atexit.register(destroy_default_group)
