"""mixle's ray_data names on a real local Ray: RayEncodedData is our ray handle; pysp_stream_accumulate."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ray")

from mixle_parallel import (  # noqa: E402
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,  # noqa: E402
)
from mixle_parallel.contracts.estimation import canonical_statistic_bytes  # noqa: E402
from mixle_parallel.ray_data import RayEncodedData  # noqa: E402

pytestmark = pytest.mark.slow

EST = MixtureEstimator([GaussianEstimator()] * 2)
MODEL = MixtureDistribution([GaussianDistribution(-1.0, 2.0), GaussianDistribution(1.0, 2.0)], [0.5, 0.5])
X = np.random.default_rng(2).normal(size=5000)


def _local(num_chunks: int):
    with encoded_data(X, estimator=EST, num_chunks=num_chunks) as h:
        return h.pysp_stream_accumulate(EST, MODEL)


def test_encoded_data_ray_returns_a_ray_encoded_data_with_the_local_bits(ray_session):
    with encoded_data(X, estimator=EST, backend="ray", num_workers=2, num_chunks=6, admission="unverified") as h:
        assert isinstance(h, RayEncodedData) and h.backend == "ray"
        nobs, stats = h.pysp_stream_accumulate(EST, MODEL)
        assert len(h.rank_records) == 0  # the streaming fold is not an E-step round
    ref = _local(6)
    assert nobs == ref[0] == 5000.0
    assert canonical_statistic_bytes(stats) == canonical_statistic_bytes(ref[1])


def test_ray_encoded_data_built_with_mixles_arguments(ray_session):
    with RayEncodedData(X, estimator=EST, num_partitions=4, num_workers=2) as h:
        assert h.num_chunks == 4 and h.num_workers == 2
        nobs, stats = h.pysp_stream_accumulate(EST, MODEL)
        fitted = h.pysp_seq_estimate(EST, MODEL)
    assert canonical_statistic_bytes(stats) == canonical_statistic_bytes(_local(4)[1])
    assert repr(fitted) == repr(EST.estimate(nobs, stats))
