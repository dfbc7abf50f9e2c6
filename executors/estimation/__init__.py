"""Distributed EM: models, chunk runners, ``encoded_data`` backends, ``optimize``, planner.

``api`` (``encoded_data``), ``optimize`` (the EM loop), ``planner``, ``component_parallel``,
``mixle_interop``; the chunk machinery in ``chunks``, ``combine_order`` and ``handle``; the
admission gate in ``admission`` (identity in ``identity``), the harness adapter in ``verifiable``,
the SDC audit of chunk statistics in ``sdc_audit``; one module per engine in ``engines/`` and the
built-in models in ``models/``. The public names are those of the modules' ``__all__``.
"""

from mixle_parallel.executors.estimation import (
    api,
    audited_mp,
    balance,
    builtin_backends,
    calibration,
    chunks,
    combine_order,
    component_parallel,
    em_observability,
    finite_guard,
    handle,
    memory,
    model_decomposition,
    models,
    options,
    planner,
    reference_handles,
    resilient_em,
    shards,
    stochastic,
    verifiable,
)
from mixle_parallel.executors.estimation import (
    optimize as _optimize_module,
)
from mixle_parallel.executors.estimation.api import *  # noqa: F403 - re-exported through __all__
from mixle_parallel.executors.estimation.audited_mp import *  # noqa: F403
from mixle_parallel.executors.estimation.balance import *  # noqa: F403
from mixle_parallel.executors.estimation.builtin_backends import *  # noqa: F403
from mixle_parallel.executors.estimation.calibration import *  # noqa: F403
from mixle_parallel.executors.estimation.chunks import *  # noqa: F403
from mixle_parallel.executors.estimation.combine_order import *  # noqa: F403
from mixle_parallel.executors.estimation.component_parallel import *  # noqa: F403
from mixle_parallel.executors.estimation.em_observability import *  # noqa: F403

# Engine runners (mpi, spark, dask, ray) import their engine only when a runner is constructed,
# so importing them here keeps this package light.
from mixle_parallel.executors.estimation.engines.dask import DaskRunner
from mixle_parallel.executors.estimation.engines.lightning import LightningEncodedData
from mixle_parallel.executors.estimation.engines.mpi import MPIChunkError, MPIEncodedData, MPIRunner, mpi_out
from mixle_parallel.executors.estimation.engines.ray import RayEncodedData, RayRunner
from mixle_parallel.executors.estimation.engines.spark import SparkRunner
from mixle_parallel.executors.estimation.engines.torchrun import (
    TorchRunChunkError,
    TorchRunEncodedData,
    TorchRunRunner,
    torchrun_out,
)
from mixle_parallel.executors.estimation.finite_guard import *  # noqa: F403
from mixle_parallel.executors.estimation.handle import *  # noqa: F403
from mixle_parallel.executors.estimation.initialization import INIT_STRATEGIES
from mixle_parallel.executors.estimation.memory import *  # noqa: F403
from mixle_parallel.executors.estimation.model_decomposition import *  # noqa: F403
from mixle_parallel.executors.estimation.models import *  # noqa: F403
from mixle_parallel.executors.estimation.optimize import *  # noqa: F403
from mixle_parallel.executors.estimation.options import EncodedDataOptions, declare_backend_options
from mixle_parallel.executors.estimation.planner import *  # noqa: F403
from mixle_parallel.executors.estimation.reference_handles import (
    DaskEncodedData,
    LocalEncodedData,
    MPEncodedData,
    SparkEncodedData,
)
from mixle_parallel.executors.estimation.resilient_em import *  # noqa: F403
from mixle_parallel.executors.estimation.shards import *  # noqa: F403
from mixle_parallel.executors.estimation.stochastic import *  # noqa: F403

builtin_backends.register_builtin_encoded_data_backends()
verifiable.register_em_verification_targets()

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
    *calibration.__all__, *memory.__all__, *shards.__all__,
})
