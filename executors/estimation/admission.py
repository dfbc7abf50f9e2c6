"""The admission gate of ``encoded_data``: on a real device mesh, run only under an accepted certificate.

The executor identity is ``identity.EMExecutorIdentity(backend)`` (capabilities
``em_<backend>``, data parallelism over workers, fp64), the plan ``ParallelPlan(dp_replicate=
workers)`` and the precision ``"fp64"`` -- exactly what ``mixle-parallel certify --backend mp
--plan dp_replicate=2 --workload gaussian_mixture`` measures, so that certificate admits ``mp`` with
any number of workers (the certificate binds the plan's axis family, not its size).

What counts as a real mesh is ``verification.require_admission``'s rule: world size > 1 or an
accelerator. The world size of an EM backend is its number of worker *processes* (mp workers,
MPI ranks, dask workers, Ray actors, Spark task slots); ``local`` and ``model_parallel`` run
threads inside this one process (world size 1), like a single-process ``torch_native`` or
``megatron`` run, so they need no certificate. The world size is worked out *before* any worker
starts. Without a certificate for a no-mesh run the environment's ``MIXLE_PARALLEL_CERTIFICATE``
(meant for meshes) is not consulted; a certificate passed explicitly is always checked.
"""

from __future__ import annotations

import os
from typing import Any

from mixle_parallel.contracts import AdmissionCertificate, NotAdmittedError, ParallelPlan
from mixle_parallel.executors.estimation.identity import EM_PRECISION, EMExecutorIdentity
from mixle_parallel.executors.registry import normalize_backend_name
from mixle_parallel.verification.admission import (
    AdmissionDecision,
    is_verifying,
    load_certificate,
    require_admission,
)

__all__ = ["EM_PRECISION", "admit_encoded_data", "canonical_backend", "planned_world"]


def canonical_backend(backend: str, builtins: dict[str, tuple[str, tuple[str, ...]]]) -> str:
    """The built-in name behind an alias (``processes`` -> ``mp``), else the normalized name."""
    key = normalize_backend_name(backend)
    for name, (_, aliases) in builtins.items():
        if key == name or key in {normalize_backend_name(a) for a in aliases}:
            return name
    return key


def planned_world(factory: Any, options: Any) -> tuple[int, int]:
    """``(workers, world size)`` the backend will run with, known before any worker starts.

    Each backend answers its own ``planned_workers(options)`` (built-ins: their engine module's);
    its ``worker_processes`` says whether those workers are processes (a world of that many) or
    threads in this process (a world of one). A factory that says nothing plans one worker.
    """
    planned = getattr(factory, "planned_workers", None)
    workers = max(1, int(planned(options))) if planned is not None else 1
    processes = bool(getattr(factory, "worker_processes", True))
    return workers, workers if processes else 1


def _as_certificate(admission: Any) -> tuple[AdmissionCertificate | None, str | None]:
    if admission is None or admission in ("required", "unverified"):
        return None, admission
    if isinstance(admission, AdmissionCertificate):
        return admission, None
    if isinstance(admission, (str, os.PathLike)):
        return load_certificate(admission), None
    raise TypeError(
        f"admission must be an AdmissionCertificate, the path of a certificate document, 'unverified' or None, "
        f"got {type(admission).__name__}"
    )


def admit_encoded_data(
    name: str, *, admission: Any, workers: int, world_size: int
) -> tuple[AdmissionDecision, AdmissionCertificate | None]:
    """The gate: an ``AdmissionDecision`` (and the certificate used), or ``NotAdmittedError``."""
    executor = EMExecutorIdentity(name)
    plan = ParallelPlan(dp_replicate=max(1, workers))
    certificate, mode = _as_certificate(admission)
    if certificate is None and mode != "unverified" and world_size <= 1 and not is_verifying():
        return AdmissionDecision(
            "local",
            None,
            executor=executor.capabilities.name,
            plan=plan.describe(),
            precision=EM_PRECISION,
            notes=("one process on CPU: no certificate needed",),
        ), None
    try:
        decision = require_admission(
            executor,
            plan,
            EM_PRECISION,
            certificate=certificate,
            admission="unverified" if mode == "unverified" else None,
            world_size=world_size,
            accelerator=False,
        )
    except NotAdmittedError as exc:
        hint = (
            f"certify with `mixle-parallel certify --backend {name} --plan dp_replicate={max(2, workers)} "
            f"--workload gaussian_mixture --out cert.json` and pass admission='cert.json'"
        )
        raise NotAdmittedError(tuple(exc.reasons) + (hint,)) from None
    return decision, certificate if decision.certified else None
