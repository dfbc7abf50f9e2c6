"""``mixle.utils.parallel.lightning_data`` names: ``LightningEncodedData`` (``backend="lightning"``) and
stepwise mini-batch EM on any backend (``minibatches``, ``stochastic_em``); re-exported."""

from mixle_parallel.executors.estimation.engines.lightning import LightningEncodedData
from mixle_parallel.executors.estimation.stochastic import StochasticFit, minibatches, stochastic_em

__all__ = ["LightningEncodedData", "StochasticFit", "minibatches", "stochastic_em"]
