"""Distributed EM: models, chunk runners, ``encoded_data`` backends, ``optimize``, planner.

The public entry points sit at the top: ``api`` (``encoded_data``), ``options`` (the options
objects), ``optimize`` (the EM loop, ``fit``) and ``handle`` (the handle every backend shares). Each
part has a folder: ``em_pass/`` (chunks and runners, the fixed combine order, the finite guard, the
compute kernel choice), ``audit/`` (the SDC audit of the pass), ``admission/`` (the gate, in-situ
certification, the executor identity, the harness adapter), ``backends/`` (one module per backend,
what a backend declares, the built-in table), ``sources/`` (rows read where they live),
``planning/`` (placement, the worker grid, decomposition, memory, calibration), ``fitting/`` (starts,
stochastic EM), ``observability/``, ``models/`` (the built-in models) and ``compat/`` (mixle 0.8.2's
shapes). The public names are those of the modules' ``__all__``.

The engine modules (dask, ray, spark, mpi, torchrun, lightning, and the mp-based resilient and
audited handles) load on first use: their names (:data:`LAZY_NAMES`) resolve through this
module's ``__getattr__``, so importing the package imports none of them.
"""

from importlib import import_module
from typing import Any

from . import api, handle, models, options
from . import (
    optimize as _optimize_module,
)
from .admission import harness_adapter
from .api import *  # noqa: F403 - re-exported through __all__
from .backends import backend_declaration, builtin_backends
from .backends.backend_declaration import BackendDeclaration
from .backends.builtin_backends import *  # noqa: F403
from .compat import reference_handles, shards
from .compat.reference_handles import (
    DaskEncodedData,
    LocalEncodedData,
    MPEncodedData,
    SparkEncodedData,
)
from .compat.shards import *  # noqa: F403
from .em_pass import chunks, combine_order, finite_guard
from .em_pass.chunks import *  # noqa: F403
from .em_pass.combine_order import *  # noqa: F403
from .em_pass.finite_guard import *  # noqa: F403
from .fitting import stochastic
from .fitting.initialization import INIT_STRATEGIES
from .fitting.stochastic import *  # noqa: F403
from .handle import *  # noqa: F403
from .models import *  # noqa: F403
from .observability import em_observability
from .observability.em_observability import *  # noqa: F403
from .optimize import *  # noqa: F403
from .options import EncodedDataOptions, UnknownOptionError, VerificationOptions, declare_backend_options
from .planning import balance, component_parallel, memory, model_decomposition, planner, resource_calibration
from .planning.balance import *  # noqa: F403
from .planning.component_parallel import *  # noqa: F403
from .planning.memory import *  # noqa: F403
from .planning.model_decomposition import *  # noqa: F403
from .planning.planner import *  # noqa: F403
from .planning.resource_calibration import *  # noqa: F403
from .sources import files, rank_local

builtin_backends.register_builtin_encoded_data_backends()
harness_adapter.register_em_verification_targets()

LAZY_NAMES: dict[str, str] = {
    "AuditedMPEncodedData": ".compat.audited_mp", "SDCAuditReceipt": ".compat.audited_mp",
    "audit_receipts": ".compat.audited_mp", "inject_bit_flip": ".compat.audited_mp",
    "CHECKPOINT_KIND": ".compat.resilient_em", "ResilientMPEncodedData": ".compat.resilient_em",
    "checkpointed_fold": ".compat.resilient_em",
    "DaskRunner": ".backends.dask",
    "LightningEncodedData": ".backends.lightning",
    "MPIChunkError": ".backends.mpi", "MPIEncodedData": ".backends.mpi", "MPIRunner": ".backends.mpi",
    "mpi_out": ".backends.mpi",
    "RayEncodedData": ".backends.ray", "RayRunner": ".backends.ray",
    "SparkRunner": ".backends.spark",
    "TorchRunChunkError": ".backends.torchrun", "TorchRunEncodedData": ".backends.torchrun",
    "TorchRunRunner": ".backends.torchrun", "torchrun_out": ".backends.torchrun",
    "save_model": ".model_file",
}
"""Public names whose module loads on first access (name -> module, relative to this package)."""


def __getattr__(name: str) -> Any:
    """The engine names of :data:`LAZY_NAMES`, imported when first used (PEP 562)."""
    if name in LAZY_NAMES:
        value = getattr(import_module(LAZY_NAMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_MORE = ["INIT_STRATEGIES", "BackendDeclaration", "EncodedDataOptions", "UnknownOptionError", "VerificationOptions",
         "declare_backend_options", "files", "rank_local", "DaskEncodedData", "LocalEncodedData", "MPEncodedData",
         "SparkEncodedData"]

__all__ = sorted({
    *api.__all__, *builtin_backends.__all__, *chunks.__all__, *combine_order.__all__, *component_parallel.__all__,
    *em_observability.__all__, *finite_guard.__all__, *balance.__all__, *model_decomposition.__all__,
    *stochastic.__all__, *handle.__all__, *models.__all__, *_optimize_module.__all__, *planner.__all__, *_MORE,
    *resource_calibration.__all__, *memory.__all__, *shards.__all__,
})
"""The public names defined once this package is imported (with :data:`LAZY_NAMES`, every public name)."""
