"""In-situ certification of EM under ``mpiexec`` (backend ``mpi``) and ``torchrun`` (backend ``torchrun``).

When ``encoded_data(..., backend="mpi"|"torchrun")`` finds no stored certificate on a multi-rank job, every
rank runs the harness's Gaussian-mixture workload through the backend on the job's own ranks (the trials
call ``encoded_data`` themselves, admitted by the in-situ capability), rank 0 judges the statistics against
the independent numpy reference (``verification.harness.em_reference``) and signs, and every rank gets the
same certificate (``verification.in_situ.certify_in_situ``). No process starts.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from typing import Any

from ....contracts import CertificateEnvelope, ParallelPlan
from ....verification.certification import CertificationError
from ....verification.harness.worker import resolve_executor
from ....verification.in_situ import CommGroup, InSituRequest, TorchGroup, certify_in_situ
from ...registry import verification_target
from ...training_in_situ import launched, launcher_name
from ..backends.optional_engine import require_engine
from .executor_identity import EM_PRECISION, em_identity_name

__all__ = ["in_situ_certifier"]

WORKLOAD = "gaussian_mixture"


def _mpi_group(world_size: int) -> Any:
    """COMM_WORLD, when the job's world is it (the trials' handles use COMM_WORLD); else None."""
    comm = require_engine("mpi4py.MPI", "mpi").COMM_WORLD
    return CommGroup(comm) if int(comm.Get_size()) == world_size else None


def _torch_group(world_size: int) -> Any:
    """The default process group (made from torchrun's variables as the ``torchrun`` engine makes it: gloo, nccl
    where CUDA is; destroyed at exit), when it is the job's."""
    dist = require_engine("torch.distributed", "torch")
    if not dist.is_initialized():
        torch = require_engine("torch", "torch")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
        dist.init_process_group(backend=backend)
        from ...torch.device_mesh import destroy_default_group

        atexit.register(destroy_default_group)
    group = TorchGroup()
    return group if group.size == world_size else None


def in_situ_certifier(name: str, world_size: int) -> Callable[[], CertificateEnvelope] | None:
    """The gate's ``auto_certify`` for EM on ``name`` over ``world_size`` launched ranks (None: not in situ: another
    backend, one rank, or no launcher around: no mpiexec variables for ``mpi``, no torchrun variables nor process
    group for ``torchrun``)."""
    kind = em_identity_name(name)  # the built-in behind an alias (mpi4py -> mpi); a replacement is neither
    if kind not in ("mpi", "torchrun") or world_size <= 1:
        return None
    if not (launcher_name() == "mpiexec" if kind == "mpi" else launched()):
        return None  # not inside a launched job: the gate refuses naming the certify command, as before
    def certify_here() -> CertificateEnvelope:
        group = _mpi_group(world_size) if kind == "mpi" else _torch_group(world_size)
        if group is None:
            raise CertificationError(f"in-situ certification of EM on {name} runs on the job's whole world; this "
                                     f"handle's {world_size} ranks are a sub-group")
        executor = resolve_executor(verification_target(name))
        return certify_in_situ(InSituRequest(
            executor=executor, plan=ParallelPlan(dp_replicate=world_size), precision=EM_PRECISION,
            device_kind="cpu", comm_backend=str(executor.comm_backend), launcher=launcher_name(), probe=None,
            workload=WORKLOAD, group=group, traced=False))

    return certify_here
