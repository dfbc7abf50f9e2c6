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

__all__ = [
    "AccumulatorFactory", "CompositeAccumulator", "CompositeDistribution", "CompositeEncoder",
    "CompositeEstimator", "ExponentialAccumulator", "ExponentialDistribution", "ExponentialEstimator",
    "GaussianAccumulator", "GaussianDistribution", "GaussianEstimator", "MixtureAccumulator",
    "MixtureDistribution", "MixtureEstimator", "ScalarEncoder", "model_digest",
]
