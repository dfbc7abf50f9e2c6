"""mixle 0.8.2's launcher forms checked before any engine starts: Fabric's gate message, the
topology-bound Fabric proxy, Ray's resource request. No lightning or ray process is started here."""

from __future__ import annotations

import sys

import pytest

from mixle_parallel import CapabilityError, LightningFabricLauncher, ParallelPlan, RayTrainLauncher
from mixle_parallel.training_launchers import _TopologyBoundFabric


def test_fabric_refuses_model_axes_with_mixles_words_and_a_fix() -> None:
    with pytest.raises(NotImplementedError, match="only owns data parallelism") as caught:
        LightningFabricLauncher().create(plan=ParallelPlan(tp=2))
    assert isinstance(caught.value, CapabilityError) and "TorchrunLauncher" in str(caught.value)


class _StandInFabric:
    """Stands in for a launched ``lightning.fabric.Fabric`` (rank 1 of 2); it has no local_rank."""

    world_size = 2
    global_rank = 1

    def launch(self) -> str:
        return "launched"


def test_topology_bound_fabric_attests_only_after_launch() -> None:
    bound = _TopologyBoundFabric(_StandInFabric(), ParallelPlan(dp_replicate=2))
    with pytest.raises(RuntimeError, match="call launch"):
        bound.attest_topology()
    assert bound.launch() == "launched"
    attestation = bound.attest_topology()
    assert (attestation.rank, attestation.world_size, attestation.coordinate.dp_replicate) == (1, 2, 1)
    assert bound.world_size == 2  # every other attribute is the Fabric's


def test_topology_bound_fabric_refuses_a_rank_outside_the_plan() -> None:
    bound = _TopologyBoundFabric(_StandInFabric(), ParallelPlan(dp_replicate=4))
    with pytest.raises(RuntimeError, match="does not fit plan"):
        bound.launch()


@pytest.mark.parametrize("use_gpu,resources,words", [
    (False, {"GPU": 1.0}, "use_gpu=False conflicts"),
    (True, {"GPU": 0.0}, "use_gpu=True conflicts"),
    (False, {"CPU": -1}, "finite numbers >= 0"),
    (False, {"CPU": float("nan")}, "finite numbers >= 0"),
    (False, {"": 1}, "non-empty strings"),
])
def test_ray_launch_checks_resources_before_ray_starts(use_gpu: bool, resources: dict, words: str) -> None:
    ray_was_loaded = "ray" in sys.modules
    with pytest.raises(ValueError, match=words):
        RayTrainLauncher().launch(lambda config: config, plan=ParallelPlan(), use_gpu=use_gpu,
                                  resources_per_worker=resources)
    with pytest.raises(ValueError, match=words):
        RayTrainLauncher(ParallelPlan(), use_gpu=use_gpu, resources_per_worker=resources)
    assert ("ray" in sys.modules) == ray_was_loaded  # refused before ray was imported
