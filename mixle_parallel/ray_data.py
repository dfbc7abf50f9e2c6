"""``mixle.utils.parallel.ray_data`` names: our ray handle (re-exported; ray loads on use)."""

from mixle_parallel.executors.estimation.backends.ray import RayEncodedData

__all__ = ["RayEncodedData"]
