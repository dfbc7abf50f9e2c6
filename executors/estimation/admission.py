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
import sys
from typing import Any

from mixle_parallel.contracts import AdmissionCertificate, NotAdmittedError, ParallelPlan
from mixle_parallel.contracts.resources import local_cpu_count
from mixle_parallel.executors.estimation.engines.support import require_engine
from mixle_parallel.executors.estimation.identity import EM_PRECISION, EMExecutorIdentity
from mixle_parallel.executors.registry import normalize_backend_name
from mixle_parallel.verification.admission import (
    AdmissionDecision,
    is_verifying,
    load_certificate,
    require_admission,
)

__all__ = ["EM_PRECISION", "admit_encoded_data", "canonical_backend", "planned_world"]

_THREADED = {"local", "model_parallel"}


def canonical_backend(backend: str, builtins: dict[str, tuple[str, tuple[str, ...]]]) -> str:
    """The built-in name behind an alias (``processes`` -> ``mp``), else the normalized name."""
    key = normalize_backend_name(backend)
    for name, (_, aliases) in builtins.items():
        if key == name or key in {normalize_backend_name(a) for a in aliases}:
            return name
    return key


def _count(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return None  # the backend itself rejects it with its own message
    return value


def planned_world(name: str, *, num_workers: int | None, resources: Any = None, client: Any = None,
                  comm: Any = None, chunk_workers: int | None = None, parallel_chunks: bool = False,
                  factory: Any = None, options: dict[str, Any] | None = None) -> tuple[int, int]:
    """``(workers, world size)`` the backend will run with, known before any worker starts."""
    options = options or {}
    n = _count(num_workers)
    if name in _THREADED:
        if n is None:
            n = _count(chunk_workers) or (len(resources) if resources is not None else None)
        if n is None:
            n = local_cpu_count() if parallel_chunks and name == "local" else 1
        return max(1, n), 1
    engine = {"dask": ("distributed", "dask"), "ray": ("ray", "ray"), "spark": ("pyspark", "spark")}.get(name)
    if engine is not None:  # a missing engine is reported first (importing it starts no worker)
        require_engine(*engine)
    if name == "mp":
        n = n if n is not None else (len(resources) if resources is not None else local_cpu_count())
    elif name == "mpi":
        if comm is None:
                comm = require_engine("mpi4py.MPI", "mpi").COMM_WORLD
        n = int(comm.Get_size())
    elif name == "torchrun":  # the job's ranks: the initialized group's size, else torchrun's WORLD_SIZE
        dist = sys.modules.get("torch.distributed")
        initialized = dist is not None and dist.is_available() and dist.is_initialized()
        n = int(dist.get_world_size()) if dist is not None and initialized else int(os.environ.get("WORLD_SIZE") or 1)
    elif name == "dask" and n is None:
        n = len(client.scheduler_info(n_workers=-1)["workers"]) if client is not None else local_cpu_count()
    elif name == "ray" and n is None:
        ray = sys.modules.get("ray")
        n = (
            int(ray.cluster_resources().get("CPU", 1))
            if ray is not None and ray.is_initialized()
            else local_cpu_count()
        )
    elif name == "spark" and n is None:
        sc = options.get("spark_context") or client
        if sc is not None and hasattr(sc, "sparkContext"):
            sc = sc.sparkContext
        if sc is None:
            pyspark = sys.modules.get("pyspark")
            sc = pyspark.SparkContext._active_spark_context if pyspark is not None else None
        n = int(sc.defaultParallelism) if sc is not None else local_cpu_count()
    elif n is None:
        planned = getattr(factory, "planned_workers", None)  # third-party factories may say
        n = int(planned(num_workers=num_workers, client=client, comm=comm, **options)) if planned else 1
    n = max(1, int(n))
    return n, n


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
