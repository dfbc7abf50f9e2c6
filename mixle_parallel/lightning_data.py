"""``mixle.utils.parallel.lightning_data`` names: ``LightningEncodedData`` (``backend="lightning"``) and
stepwise mini-batch EM on any backend (``minibatches``, ``stochastic_em``); re-exported."""

from mixle_parallel.executors.estimation.backends.lightning import LightningEncodedData
from mixle_parallel.executors.estimation.fitting.minibatch import epoch_seed
from mixle_parallel.executors.estimation.fitting.stochastic import StochasticFit, minibatches, stochastic_em

_epoch_seed = epoch_seed
"""mixle's private name for the seed of one epoch's batch order (mixle's tests import it)."""

__all__ = ["LightningEncodedData", "StochasticFit", "epoch_seed", "minibatches", "stochastic_em"]
