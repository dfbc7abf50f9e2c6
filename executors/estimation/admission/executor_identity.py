"""The identity of EM on a backend, as certificates bind it and the admission gate checks it.

``em_capabilities(backend)`` (capabilities ``em_<backend>``: data parallelism over workers, fp64),
``EM_EXECUTOR_VERSION``, the one declared update ``stats:data`` and the code a certificate binds (the
library, plus the package of a registered third-party factory: ``source_files``). ``EMExecutorIdentity`` is what
``encoded_data``'s gate hands to ``require_admission``; ``verifiable.VerifiableEncodedData`` adds
the harness trial on top of it. The identity follows the *factory* a name is bound to
(:func:`em_identity_name`): a built-in under any of its names is the built-in, and a third party's
``override=True`` over a built-in name is certified under a name of its own, never the built-in's.
"""

from __future__ import annotations

from pathlib import Path

from ....contracts import (
    BackendCapabilities,
    CollectiveKind,
    DistributedUpdate,
    ParallelAxis,
    ParallelPlan,
    PayloadKind,
    StateLayout,
)
from ....verification.source_binding import defining_module, is_builtin_module, object_files
from ...registry import (
    encoded_data_registered_name,
    get_encoded_data_backend,
    is_encoded_data_backend,
    normalize_backend_name,
)
from ..backends.builtin_backends import builtin_backend_name, builtin_keys

__all__ = ["EM_EXECUTOR_VERSION", "EM_PRECISION", "EMExecutorIdentity", "em_capabilities", "em_identity_name"]

EM_EXECUTOR_VERSION = "1.0.0"
"""Version of the EM executors bound into certificates."""

EM_PRECISION = "fp64"
"""The precision EM statistics are computed and certified at."""


def em_capabilities(backend: str) -> BackendCapabilities:
    """The capability declaration of EM on ``backend``: data parallelism over workers, float64 statistics."""
    return BackendCapabilities(
        name=f"em_{normalize_backend_name(backend)}",
        axes=frozenset({ParallelAxis.DP_REPLICATE}),
        precisions=frozenset({EM_PRECISION}),
    )


_MESSAGES_PER_WORKER = {"mp": 2, "dask": 2, "ray": 2}
"""Built-in engines whose E-step traffic is one request and one reply per worker, which the harness holds them to.
(spark sends one task per partition, mpi and torchrun are SPMD collectives: their counts are reported, not judged.)"""


def em_identity_name(backend: str) -> str:
    """The name EM on the backend bound to ``backend`` is certified under.

    A built-in factory is its built-in name (``processes`` -> ``mp``); a third party's factory is the
    name it was registered under, and where that name shadows a built-in (``override=True``) the name
    also carries the factory's qualified name (``mp[pkg.module.factory]``), so no certificate earned
    by the built-in admits it and none earned by it admits the built-in.
    """
    key = normalize_backend_name(backend)
    if not is_encoded_data_backend(key):
        return key
    factory = get_encoded_data_backend(key)
    builtin = builtin_backend_name(factory)
    if builtin is not None:
        return builtin
    name = encoded_data_registered_name(key)
    if name not in builtin_keys():
        return name
    qualified = f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', type(factory).__qualname__)}"
    return f"{name}[{qualified}]"


_ENGINE_LIBRARIES = {"dask": ("dask", "distributed"), "ray": ("ray",), "spark": ("pyspark",), "mpi": ("mpi4py",)}


class EMExecutorIdentity:
    """EM on one backend as an executor identity: capabilities, version and declared updates.

    ``backend`` is the registry key that runs (what the harness passes to ``encoded_data``); ``name``
    is :func:`em_identity_name` of it, fixed when the identity is made (what certificates bind).
    """

    verification_family = "em"
    """Certificates of EM are judged against the bitwise EM tolerance policy."""

    def __init__(self, backend: str = "mp") -> None:
        self.backend = normalize_backend_name(backend)
        self.name = em_identity_name(self.backend)

    @property
    def comm_backend(self) -> str:
        """How the workers' statistics travel: the backend's own transport, named after it."""
        return self.name

    @property
    def certified_libraries(self) -> tuple[str, ...]:
        """Distributions beyond python/numpy/torch whose versions a certificate binds (the engine)."""
        return _ENGINE_LIBRARIES.get(self.name, ())

    @property
    def capabilities(self) -> BackendCapabilities:
        """``em_capabilities(name)``."""
        return em_capabilities(self.name)

    @property
    def version(self) -> str:
        """EM executor version."""
        return EM_EXECUTOR_VERSION

    def source_files(self) -> list[Path]:
        """The files of the registered factory's package, beside the library's own (``source_binding``): a
        certificate of a third-party backend binds the backend's code, package data included."""
        if not is_encoded_data_backend(self.backend):
            return []
        factory = get_encoded_data_backend(self.backend)
        return [] if is_builtin_module(defining_module(factory)) else sorted(object_files(factory))

    def collectives_per_step(self, plan: ParallelPlan) -> dict[str, int]:
        """The messages per E-step ``stats:data`` hands to the transport, where the backend states it (the harness
        holds the observed count to it): ``mp``, ``dask``, ``ray`` one request and one reply per worker; a factory's
        ``collectives_per_step(plan)``; nothing declared otherwise (the count is then reported, not judged)."""
        if plan.dp_replicate < 2:
            return {}
        if self.name in _MESSAGES_PER_WORKER:  # the built-in under any of its names, never a replacement
            return {"stats:data": _MESSAGES_PER_WORKER[self.name] * plan.dp_replicate}
        factory = get_encoded_data_backend(self.backend) if is_encoded_data_backend(self.backend) else None
        declared = getattr(factory, "collectives_per_step", None)
        return dict(declared(plan)) if callable(declared) else {}

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        """One update: chunk statistics gathered from the workers and combined in chunk order."""
        axes = (ParallelAxis.DP_REPLICATE,) if plan.dp_replicate > 1 else ()
        return (
            DistributedUpdate(
                "stats:data",
                PayloadKind.SUFFICIENT_STATISTIC,
                CollectiveKind.CUSTOM if axes else CollectiveKind.NONE,
                axes,
                StateLayout.REPLICATED,
                not axes,
                notes=("per-chunk statistics gathered to the driver and combined in chunk order",),
            ),
        )
