"""``mixle.utils.parallel.lightning_data`` names implemented so far: stepwise mini-batch EM on any
backend (``minibatches``, ``stochastic_em``; re-exported). ``LightningEncodedData`` is not provided yet."""

from mixle_parallel.executors.estimation.stochastic import StochasticFit, minibatches, stochastic_em

__all__ = ["StochasticFit", "minibatches", "stochastic_em"]
