"""In-situ certification for a launched training run: the ``auto_certify`` its ``prepare()`` hands the gate.

When the gate finds no trusted certificate for a multi-rank plan and the trust store's policy allows
certifying here, ``in_situ_certifier(...)`` makes the run's process group (from the launcher's
environment when none exists yet), then certifies on those very ranks
(``verification.in_situ.certify_in_situ``): the harness's reference workload for the plan family
through the backend, plus the backend's probe of the user's own module. Any launcher works; its name
is recorded (``torchrun``, ``mpiexec``, else ``launched``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..contracts import CertificateEnvelope, ParallelPlan, comm_backend_for
from ..verification.harness.worker import resolve_executor
from ..verification.in_situ import InSituRequest, ProbeOutcome, certify_in_situ

__all__ = ["in_situ_certifier", "launched", "launcher_name"]

_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and launchers that follow it) set in every rank; without them and without a group, nothing is
launched: the gate refuses naming ``mixle-parallel certify`` as before."""


def launcher_name(environ: dict[str, str] | None = None) -> str:
    """What started this rank, from the variables launchers set: ``torchrun``, ``mpiexec`` or ``launched``."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if any(k in env for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")):
        return "mpiexec"
    return "launched"


def launched(environ: dict[str, str] | None = None) -> bool:
    """True inside a launched job: a process group exists, or a launcher set the torchrun variables."""
    import torch.distributed as dist

    env = os.environ if environ is None else environ
    return (dist.is_available() and dist.is_initialized()) or all(k in env for k in _LAUNCH_ENV)


def in_situ_certifier(backend_name: str, plan: ParallelPlan, precision: str, *, device: Any,
                      ensure_group: Callable[[], Any],
                      probe: Callable[[], ProbeOutcome] | None) -> Callable[[], CertificateEnvelope] | None:
    """The gate's ``auto_certify`` for a launched run of ``plan`` (None for one rank, or outside a launched job).

    ``backend_name`` names the backend whose harness adapter (``register_verification_target``) runs the
    reference workload, resolved only when certifying; ``ensure_group`` makes or checks the process
    group; ``probe`` runs the backend's probe of the user's module on every rank.
    """
    if plan.world_size == 1 or not launched():
        return None
    kind = str(getattr(device, "type", device))

    def certify_here() -> CertificateEnvelope:
        ensure_group()
        return certify_in_situ(InSituRequest(
            executor=resolve_executor(backend_name), plan=plan, precision=precision, device_kind=kind,
            comm_backend=comm_backend_for(device), launcher=launcher_name(), probe=probe))

    return certify_here
