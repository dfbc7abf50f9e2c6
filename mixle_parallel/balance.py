"""``mixle.utils.parallel.balance`` names: the FLOPs-under-memory worker grid for EM (re-exported)."""

from mixle_parallel.executors.estimation.planning.balance import *  # noqa: F403 - a thin facade
from mixle_parallel.executors.estimation.planning.balance import __all__ as __all__
