"""Built-in EM models (vectorized numpy, float64), named as in mixle's statistics vocabulary."""

from mixle_parallel.executors.estimation.models._base import AccumulatorFactory, model_digest
from mixle_parallel.executors.estimation.models.combinators import (
    CompositeAccumulator,
    CompositeDistribution,
    CompositeEncoder,
    CompositeEstimator,
    MixtureAccumulator,
    MixtureDistribution,
    MixtureEstimator,
)
from mixle_parallel.executors.estimation.models.continuous import (
    ExponentialAccumulator,
    ExponentialDistribution,
    ExponentialEstimator,
    GaussianAccumulator,
    GaussianDistribution,
    GaussianEstimator,
    ScalarEncoder,
)
from mixle_parallel.executors.estimation.models.discrete import (
    CategoricalAccumulator,
    CategoricalDistribution,
    CategoricalEncoder,
    CategoricalEstimator,
    PoissonAccumulator,
    PoissonDistribution,
    PoissonEncoder,
    PoissonEstimator,
)
from mixle_parallel.executors.estimation.models.multivariate import (
    DiagonalGaussianAccumulator,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    MultivariateGaussianAccumulator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    VectorEncoder,
)

__all__ = [
    "CategoricalAccumulator", "CategoricalDistribution", "CategoricalEncoder", "CategoricalEstimator",
    "DiagonalGaussianAccumulator", "DiagonalGaussianDistribution", "DiagonalGaussianEstimator",
    "MultivariateGaussianAccumulator", "MultivariateGaussianDistribution", "MultivariateGaussianEstimator",
    "PoissonAccumulator", "PoissonDistribution", "PoissonEncoder", "PoissonEstimator", "VectorEncoder",
    "AccumulatorFactory", "CompositeAccumulator", "CompositeDistribution", "CompositeEncoder",
    "CompositeEstimator", "ExponentialAccumulator", "ExponentialDistribution", "ExponentialEstimator",
    "GaussianAccumulator", "GaussianDistribution", "GaussianEstimator", "MixtureAccumulator",
    "MixtureDistribution", "MixtureEstimator", "ScalarEncoder", "model_digest",
]
