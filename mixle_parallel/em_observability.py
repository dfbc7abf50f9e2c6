"""``mixle.utils.parallel.em_observability`` names: per-worker pass records and their verdicts (re-exported)."""

from mixle_parallel.executors.estimation.observability.em_observability import *  # noqa: F403 - a thin facade
from mixle_parallel.executors.estimation.observability.em_observability import __all__ as __all__
