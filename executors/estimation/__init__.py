"""Distributed EM: models, chunk runners, ``encoded_data`` backends, ``optimize``, planner.

``api`` (``encoded_data``), ``options`` (the options objects), ``backend_declaration`` (what a
backend honours), ``optimize`` (the EM loop), ``planner``, ``component_parallel``,
``mixle_interop``; the chunk machinery in ``chunks``, ``combine_order`` and ``handle``; the
admission gate in ``em_admission`` (the identity it checks in ``executor_identity``), the harness
adapter in ``harness_adapter``, the SDC audit of chunk statistics in ``sdc_audit``; one module per
engine in ``engines/`` and the built-in models in ``models/``. The public names are those of the
modules' ``__all__``.

The engine modules (dask, ray, spark, mpi, torchrun, lightning, and the mp-based resilient and
audited handles) load on first use: their names (:data:`LAZY_NAMES`) resolve through this
module's ``__getattr__``, so importing the package imports none of them.
"""

from importlib import import_module
from typing import Any

from . import (
    api,
    backend_declaration,
    balance,
    builtin_backends,
    chunks,
    combine_order,
    component_parallel,
    em_observability,
    finite_guard,
    handle,
    harness_adapter,
    memory,
    model_decomposition,
    models,
    options,
    planner,
    reference_handles,
    resource_calibration,
    shards,
    stochastic,
)
from . import (
    optimize as _optimize_module,
)
from .api import *  # noqa: F403 - re-exported through __all__
from .backend_declaration import BackendDeclaration
from .balance import *  # noqa: F403
from .builtin_backends import *  # noqa: F403
from .chunks import *  # noqa: F403
from .combine_order import *  # noqa: F403
from .component_parallel import *  # noqa: F403
from .em_observability import *  # noqa: F403
from .finite_guard import *  # noqa: F403
from .handle import *  # noqa: F403
from .initialization import INIT_STRATEGIES
from .memory import *  # noqa: F403
from .model_decomposition import *  # noqa: F403
from .models import *  # noqa: F403
from .optimize import *  # noqa: F403
from .options import EncodedDataOptions, UnknownOptionError, VerificationOptions, declare_backend_options
from .planner import *  # noqa: F403
from .reference_handles import (
    DaskEncodedData,
    LocalEncodedData,
    MPEncodedData,
    SparkEncodedData,
)
from .resource_calibration import *  # noqa: F403
from .shards import *  # noqa: F403
from .sources import files, rank_local
from .stochastic import *  # noqa: F403

builtin_backends.register_builtin_encoded_data_backends()
harness_adapter.register_em_verification_targets()

LAZY_NAMES: dict[str, str] = {
    "AuditedMPEncodedData": ".audited_mp", "SDCAuditReceipt": ".audited_mp", "audit_receipts": ".audited_mp",
    "inject_bit_flip": ".audited_mp",
    "CHECKPOINT_KIND": ".resilient_em", "ResilientMPEncodedData": ".resilient_em",
    "checkpointed_fold": ".resilient_em",
    "DaskRunner": ".engines.dask",
    "LightningEncodedData": ".engines.lightning",
    "MPIChunkError": ".engines.mpi", "MPIEncodedData": ".engines.mpi", "MPIRunner": ".engines.mpi",
    "mpi_out": ".engines.mpi",
    "RayEncodedData": ".engines.ray", "RayRunner": ".engines.ray",
    "SparkRunner": ".engines.spark",
    "TorchRunChunkError": ".engines.torchrun", "TorchRunEncodedData": ".engines.torchrun",
    "TorchRunRunner": ".engines.torchrun", "torchrun_out": ".engines.torchrun",
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
