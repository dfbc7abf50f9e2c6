"""``mixle.utils.parallel.model_decomposition`` names: structural sizing and model cuts (re-exported)."""

from mixle_parallel.executors.estimation.planning.model_decomposition import *  # noqa: F403 - a thin facade
from mixle_parallel.executors.estimation.planning.model_decomposition import __all__ as __all__
