"""estimate_model_nbytes / estimate_estimator_stat_nbytes: sizes from declarations only, unknown ones refused."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.contracts import MemorySized, UnknownMemoryFootprintError
from mixle_parallel.executors.estimation import (
    Decomposition,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    estimate_estimator_stat_nbytes,
    estimate_model_nbytes,
)
from mixle_parallel.executors.estimation.planning.model_decomposition import DecompAxis, ReductionOp


class _Declared:
    def __init__(self, n: int) -> None:
        self.n = n

    def mixle_memory_nbytes(self) -> int:
        return self.n


class _Opaque:
    def __init__(self) -> None:
        self.weights = np.zeros(1000)  # present, but not declared: no __dict__ walk finds it


class _Tree:
    def __init__(self, leaves: list) -> None:
        self.leaves, self.bias = leaves, np.zeros(3)

    def decomposition(self) -> Decomposition:
        return Decomposition(axis=DecompAxis.COMPONENT, reduction=ReductionOp.SUM, units=self.leaves,
                             params=(self.bias,))


def test_built_in_models_are_sized_through_their_decomposition() -> None:
    diag = DiagonalGaussianDistribution(np.zeros(4), np.ones(4))
    assert estimate_model_nbytes(diag) == 2 * 4 * 8
    shared = GaussianDistribution(0.0, 1.0)
    mixture = MixtureDistribution([shared, shared, GaussianDistribution(1.0, 1.0)], np.full(3, 1 / 3))
    assert estimate_model_nbytes(mixture) == 2 * 3 * 8 + 2 * 16  # weights + log weights; the shared leaf once
    assert estimate_model_nbytes(None) == 0


def test_declared_sizes_and_decomposition_trees() -> None:
    assert isinstance(_Declared(5), MemorySized) and not isinstance(_Opaque(), MemorySized)
    assert estimate_model_nbytes(_Declared(12345)) == 12345
    assert estimate_model_nbytes(_Tree([_Declared(100), _Declared(50)])) == 3 * 8 + 150
    assert estimate_model_nbytes((np.zeros((2, 3), dtype=np.float32), {"k": 1.0})) == 24 + 1 + 8


def test_torch_modules_count_parameters_and_buffers() -> None:
    torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")
    layer = torch.nn.BatchNorm1d(4)  # weight, bias (fp32) + running mean/var (fp32) + num_batches (int64)
    assert estimate_model_nbytes(layer) == 4 * 4 * 4 + 8


def test_unknown_sizes_are_refused_with_the_path_and_the_fix() -> None:
    with pytest.raises(UnknownMemoryFootprintError, match=r"_Opaque.*declares no size.*mixle_memory_nbytes"):
        estimate_model_nbytes(_Opaque())
    with pytest.raises(UnknownMemoryFootprintError, match=r"_Tree/component_1"):
        estimate_model_nbytes(_Tree([_Declared(1), _Opaque()]))
    with pytest.raises(UnknownMemoryFootprintError, match="returned -1"):
        estimate_model_nbytes(_Declared(-1))


def test_estimator_statistic_bytes_are_the_zero_accumulators_value() -> None:
    assert estimate_estimator_stat_nbytes(GaussianEstimator()) == 3 * 8  # sums of w, wx, wx^2
    assert estimate_estimator_stat_nbytes(DiagonalGaussianEstimator(4)) == 8 + 2 * 4 * 8
    assert estimate_estimator_stat_nbytes(MixtureEstimator([GaussianEstimator()] * 3)) == 3 * 8 + 3 * 3 * 8
    assert estimate_estimator_stat_nbytes(None) == 0

    class NoAccumulator:
        def accumulator_factory(self):
            raise RuntimeError("no statistics")

        def estimate(self, nobs, stats):
            return None

        def encoder(self):
            return None

    with pytest.raises(UnknownMemoryFootprintError, match="zero accumulator for NoAccumulator"):
        estimate_estimator_stat_nbytes(NoAccumulator())


def test_mixle_models_are_sized_through_the_family_table_or_refused() -> None:
    stats = pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")
    mixle_mixture = stats.MixtureDistribution([stats.GaussianDistribution(0.0, 1.0),
                                               stats.GaussianDistribution(1.0, 2.0)], [0.5, 0.5])
    ours = MixtureDistribution([GaussianDistribution(0.0, 1.0), GaussianDistribution(1.0, 2.0)], [0.5, 0.5])
    assert estimate_model_nbytes(mixle_mixture) == estimate_model_nbytes(ours) == 2 * 2 * 8 + 2 * 2 * 8
    unlisted = stats.BinomialDistribution(0.3, 10)  # has mixle's decomposition(), no entry in the family table
    with pytest.raises(UnknownMemoryFootprintError, match="register_mixle_family"):
        estimate_model_nbytes(unlisted)
