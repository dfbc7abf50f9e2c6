"""mixle's ``mixle.utils.parallel.training_launchers``: Lightning Fabric and Ray Train launchers, rank attestation.

The launchers import lightning/ray only when they create or launch something.
"""

from mixle_parallel.contracts import WorkerTopologyAttestation, attest_worker_coordinate
from mixle_parallel.executors.launchers.fabric import LightningFabricLauncher, TopologyBoundFabric
from mixle_parallel.executors.launchers.ray import RayTrainLauncher

_TopologyBoundFabric = TopologyBoundFabric  # mixle 0.8.2's private name, imported by its tests

__all__ = ["LightningFabricLauncher", "RayTrainLauncher", "WorkerTopologyAttestation", "attest_worker_coordinate"]
