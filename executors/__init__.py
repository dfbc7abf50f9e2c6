"""Executors: registries and the pluggable backends that register themselves in them."""

from typing import Any

from . import (
    estimation,  # numpy only; registers the built-in encoded-data backends (lazy factories)
    registry,
)
from .registry import *  # noqa: F403 - re-exported through __all__

# Heavy executors load on first attribute access, so importing this package stays torch-free.
# They stay out of __all__: ``from mixle_parallel.executors import *`` (the facade) must not import
# torch. Reach them as attributes, e.g. ``mixle_parallel.executors.TorchDistributedBackend``.
LAZY_EXECUTORS = {
    "TorchDistributedBackend": "mixle_parallel.executors.torch.backend",
    "TorchDistributedSession": "mixle_parallel.executors.torch.session",
    "StreamingTokenEncodedData": "mixle_parallel.executors.torch.streaming_tokens",
    "describe_parameter_layouts": "mixle_parallel.executors.torch.layouts",
    "CollectiveMeter": "mixle_parallel.executors.torch.comm_meter",
    "save_checkpoint": "mixle_parallel.executors.torch.checkpoint",
    "load_checkpoint": "mixle_parallel.executors.torch.checkpoint",
    "CheckpointHandle": "mixle_parallel.executors.torch.checkpoint",
    "AsyncTrainingCheckpoint": "mixle_parallel.executors.torch.dcp_checkpoint",
    "async_save_training_state": "mixle_parallel.executors.torch.dcp_checkpoint",
    "load_sharded": "mixle_parallel.executors.torch.dcp_checkpoint",
    "load_training_metadata": "mixle_parallel.executors.torch.dcp_checkpoint",
    "load_training_state": "mixle_parallel.executors.torch.dcp_checkpoint",
    "save_frozen_training_state": "mixle_parallel.executors.torch.dcp_checkpoint",
    "save_sharded": "mixle_parallel.executors.torch.dcp_checkpoint",
    "save_training_state": "mixle_parallel.executors.torch.dcp_checkpoint",
    "AsyncCheckpointHandle": "mixle_parallel.executors.torch.fault_tolerant",
    "LoaderState": "mixle_parallel.executors.torch.fault_tolerant",
    "load_checkpoint_extra": "mixle_parallel.executors.torch.fault_tolerant",
    "resume_batches": "mixle_parallel.executors.torch.fault_tolerant",
    "save_checkpoint_async": "mixle_parallel.executors.torch.fault_tolerant",
    "synthetic_batch_for_state": "mixle_parallel.executors.torch.fault_tolerant",
    "StepResult": "mixle_parallel.executors.torch.simulated_rank",
    "SimulatedRank": "mixle_parallel.executors.torch.simulated_rank",
    "ElasticTrainingJob": "mixle_parallel.executors.torch.elastic_job",
    "CheckpointError": "mixle_parallel.executors.torch.checkpoint_manifest",
    "CorruptCheckpointError": "mixle_parallel.executors.torch.checkpoint_manifest",
    "WorldSizeChangeError": "mixle_parallel.executors.torch.checkpoint_manifest",
    "UntrustedCheckpointError": "mixle_parallel.executors.torch.checkpoint_manifest",
    "DamagedRecordError": "mixle_parallel.executors.torch.checkpoint_marks",
    "MegatronBackend": "mixle_parallel.executors.megatron.backend",
    "MegatronSession": "mixle_parallel.executors.megatron.session",
    "MegatronBridgeBackend": "mixle_parallel.executors.megatron.bridge",
    "MegatronBridgeSession": "mixle_parallel.executors.megatron.bridge",
    "cpu_compat": "mixle_parallel.executors.megatron.cpu_compat",
    "HealthOptions": "mixle_parallel.executors.training_options",
    "TrainOptions": "mixle_parallel.executors.training_options",
    "AuditOptions": "mixle_parallel.executors.training_options",
    "RankFailureError": "mixle_parallel.executors.torch.health",
    "VerifiableTorchNative": "mixle_parallel.executors.torch.harness_adapter",
    "VerifiableEncodedData": "mixle_parallel.executors.estimation.admission.harness_adapter",
    "em_capabilities": "mixle_parallel.executors.estimation.admission.harness_adapter",
    "LaunchContext": "mixle_parallel.executors.launchers.base",
    "bind_launched_rank": "mixle_parallel.executors.launchers.base",
    "TorchrunLauncher": "mixle_parallel.executors.launchers.torchrun",
    "LightningFabricLauncher": "mixle_parallel.executors.launchers.fabric",
    "TopologyBoundFabric": "mixle_parallel.executors.launchers.fabric",
    "RayTrainLauncher": "mixle_parallel.executors.launchers.ray",
}


def __getattr__(name: str) -> Any:
    """Load an executor on first use: heavy ones (torch, megatron) and the numpy EM names alike."""
    from importlib import import_module

    if name in LAZY_EXECUTORS:
        return getattr(import_module(LAZY_EXECUTORS[name]), name)
    if name in estimation.__all__:
        return getattr(estimation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(registry.__all__)  # the lazy names stay out: a star-import would load torch and megatron
