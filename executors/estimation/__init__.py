"""Distributed EM: models, chunk runners, ``encoded_data`` backends, ``optimize``, planner.

``api`` (``encoded_data``), ``optimize`` (the EM loop), ``planner``, ``component_parallel``,
``mixle_interop``; the chunk machinery in ``chunks``, ``combine_order`` and ``handle``; the
admission gate in ``em_admission`` (the identity it checks in ``executor_identity``), the harness
adapter in ``harness_adapter``,
the SDC audit of chunk statistics in ``sdc_audit``; one module per engine in ``engines/`` and the
built-in models in ``models/``. The public names are those of the modules' ``__all__``.
"""

from . import (
    api,
    audited_mp,
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
    resilient_em,
    resource_calibration,
    shards,
    stochastic,
)
from . import (
    optimize as _optimize_module,
)
from .api import *  # noqa: F403 - re-exported through __all__
from .audited_mp import *  # noqa: F403
from .balance import *  # noqa: F403
from .builtin_backends import *  # noqa: F403
from .chunks import *  # noqa: F403
from .combine_order import *  # noqa: F403
from .component_parallel import *  # noqa: F403
from .em_observability import *  # noqa: F403

# Engine runners (mpi, spark, dask, ray) import their engine only when a runner is constructed,
# so importing them here keeps this package light.
from .engines.dask import DaskRunner
from .engines.lightning import LightningEncodedData
from .engines.mpi import MPIChunkError, MPIEncodedData, MPIRunner, mpi_out
from .engines.ray import RayEncodedData, RayRunner
from .engines.spark import SparkRunner
from .engines.torchrun import (
    TorchRunChunkError,
    TorchRunEncodedData,
    TorchRunRunner,
    torchrun_out,
)
from .finite_guard import *  # noqa: F403
from .handle import *  # noqa: F403
from .initialization import INIT_STRATEGIES
from .memory import *  # noqa: F403
from .model_decomposition import *  # noqa: F403
from .models import *  # noqa: F403
from .optimize import *  # noqa: F403
from .options import EncodedDataOptions, declare_backend_options
from .planner import *  # noqa: F403
from .reference_handles import (
    DaskEncodedData,
    LocalEncodedData,
    MPEncodedData,
    SparkEncodedData,
)
from .resilient_em import *  # noqa: F403
from .resource_calibration import *  # noqa: F403
from .shards import *  # noqa: F403
from .stochastic import *  # noqa: F403

builtin_backends.register_builtin_encoded_data_backends()
harness_adapter.register_em_verification_targets()

_ENGINE_RUNNERS = [
    "DaskRunner", "LightningEncodedData", "MPIChunkError", "MPIEncodedData", "MPIRunner", "RayEncodedData",
    "RayRunner", "SparkRunner",
    "TorchRunChunkError", "TorchRunEncodedData", "TorchRunRunner", "mpi_out", "torchrun_out",
]
_MORE = ["INIT_STRATEGIES", "EncodedDataOptions", "declare_backend_options", "DaskEncodedData", "LocalEncodedData",
         "MPEncodedData", "SparkEncodedData"]

__all__ = sorted({
    *api.__all__, *builtin_backends.__all__, *chunks.__all__, *combine_order.__all__, *component_parallel.__all__,
    *em_observability.__all__, *audited_mp.__all__, *finite_guard.__all__, *balance.__all__,
    *model_decomposition.__all__, *resilient_em.__all__, *stochastic.__all__,
    *handle.__all__, *models.__all__, *_optimize_module.__all__, *planner.__all__, *_ENGINE_RUNNERS, *_MORE,
    *resource_calibration.__all__, *memory.__all__, *shards.__all__,
})
