"""Built-in EM models (vectorized numpy, float64), named as in mixle's statistics vocabulary."""

from ._base import AccumulatorFactory, model_digest
from .combinators import (
    CompositeAccumulator,
    CompositeDistribution,
    CompositeEncoder,
    CompositeEstimator,
    MixtureAccumulator,
    MixtureDistribution,
    MixtureEstimator,
)
from .continuous import (
    ExponentialAccumulator,
    ExponentialDistribution,
    ExponentialEstimator,
    GaussianAccumulator,
    GaussianDistribution,
    GaussianEstimator,
    ScalarEncoder,
)
from .discrete import (
    CategoricalAccumulator,
    CategoricalDistribution,
    CategoricalEncoder,
    CategoricalEstimator,
    PoissonAccumulator,
    PoissonDistribution,
    PoissonEncoder,
    PoissonEstimator,
)
from .multivariate import (
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
