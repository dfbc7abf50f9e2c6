"""local and mp backends: identical model bits for every worker count; handle and registry rules."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors import get_encoded_data_backend, register_encoded_data_backend
from mixle_parallel.executors.estimation import (
    DEFAULT_CHUNK_MULTIPLE,
    DEFAULT_CHUNK_SIZE,
    CategoricalEstimator,
    ChunkedEncodedData,
    CompositeEstimator,
    DiagonalGaussianEstimator,
    EncodedDataControlConflictError,
    GaussianEstimator,
    MixtureEstimator,
    chunk_bounds,
    encoded_data,
    fit,
    is_encoded_data_handle,
    optimize,
)

SEED = 1234


def _model_bytes(model) -> bytes:
    return canonical_statistic_bytes(model.params())


def test_chunk_bounds_depend_only_on_rows_and_chunking():
    assert chunk_bounds(10, num_chunks=3) == ((0, 3), (3, 6), (6, 10))
    assert chunk_bounds(5, num_chunks=9) == tuple((i, i + 1) for i in range(5))
    assert chunk_bounds(0) == ((0, 0),)
    assert len(chunk_bounds(100_000, chunk_size=16384)) == 7
    with pytest.raises(ValueError, match="not both"):
        chunk_bounds(10, num_chunks=2, chunk_size=3)


@pytest.mark.parametrize("rows", [1, 16_384, 16_385, 200_000, 1_000_000, 1_234_567])
def test_default_chunks_split_evenly_over_common_worker_counts(rows):
    bounds = chunk_bounds(rows)
    sizes = [b - a for a, b in bounds]
    assert max(sizes) <= DEFAULT_CHUNK_SIZE and sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    if len(bounds) > 1:  # a multiple of 12: 1, 2, 3, 4 and 6 workers get equal contiguous blocks
        assert len(bounds) % DEFAULT_CHUNK_MULTIPLE == 0
        assert len(bounds) - DEFAULT_CHUNK_MULTIPLE < -(-rows // DEFAULT_CHUNK_SIZE)  # the smallest such count
    else:
        assert rows <= DEFAULT_CHUNK_SIZE


def test_every_worker_count_and_backend_gives_the_same_bits(gmm_1d, gmm_4d):
    est1 = MixtureEstimator([GaussianEstimator()] * 3)
    est4 = MixtureEstimator([DiagonalGaussianEstimator(4)] * 2)
    results = {}
    for backend, workers in [("local", 1), ("local", 2), ("local", 3), ("mp", 1), ("mp", 2), ("mp", 3)]:
        # admission="unverified": a throwaway test mesh; the bits are what this test checks
        m1 = optimize(gmm_1d, est1, max_its=6, delta=None, seed=SEED, backend=backend, num_workers=workers,
                      chunk_size=700, admission="unverified")
        m4 = optimize(gmm_4d, est4, max_its=4, delta=None, seed=SEED, backend=backend, num_workers=workers,
                      chunk_size=500, admission="unverified")
        results[(backend, workers)] = _model_bytes(m1) + _model_bytes(m4)
    assert len(set(results.values())) == 1, "model bits differ between backends/worker counts"


def test_heterogeneous_records_fit_identically_on_mp():
    rng = np.random.default_rng(3)
    rows = [(float(rng.normal(2 * (i % 2), 1)), "ab"[i % 2] if rng.random() < 0.9 else "c") for i in range(900)]
    est = MixtureEstimator([CompositeEstimator([GaussianEstimator(), CategoricalEstimator()])] * 2)
    local = optimize(rows, est, max_its=5, delta=None, seed=5, chunk_size=200)
    remote = optimize(rows, est, max_its=5, delta=None, seed=5, chunk_size=200, backend="mp", num_workers=2,
                      admission="unverified")  # a test mesh: compared bitwise with the local fit above
    assert _model_bytes(local) == _model_bytes(remote)


def test_handle_reuse_and_control_conflicts(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 2)
    with encoded_data(gmm_1d, estimator=est, num_chunks=4) as handle:
        assert is_encoded_data_handle(handle) and isinstance(handle, ChunkedEncodedData)
        assert encoded_data(handle) is handle  # reuse unchanged
        with pytest.raises(EncodedDataControlConflictError, match="num_workers, seed"):
            encoded_data(handle, num_workers=2, seed=3)
        with pytest.raises(EncodedDataControlConflictError, match="backend"):
            encoded_data(handle, backend="mp")
        with pytest.raises(EncodedDataControlConflictError, match="root_only"):
            optimize(handle, est, max_its=1, root_only=True)
        n, ll = handle.pysp_seq_log_density_sum(handle.pysp_seq_initialize(est, 1, 0.5))
        assert n == len(gmm_1d) and np.isfinite(ll)
    assert not is_encoded_data_handle(gmm_1d)
    with pytest.raises(RuntimeError, match="closed"):
        handle.pysp_seq_initialize(est, 1, 0.5)


def test_unknown_and_blank_backends_are_refused(gmm_1d):
    with pytest.raises(ValueError, match="unknown encoded-data backend 'nope'.*local"):
        encoded_data(gmm_1d, backend="nope")
    with pytest.raises(ValueError, match="non-empty"):
        encoded_data(gmm_1d, backend=" ")


def test_builtin_backends_register_like_third_parties():
    encoded_data([1.0], estimator=GaussianEstimator()).close()  # ensures registration ran
    factory = get_encoded_data_backend("local")
    register_encoded_data_backend("local", factory)  # same factory: no-op
    with pytest.raises(ValueError, match="already registered"):
        register_encoded_data_backend("local", lambda data, **_: None)


def test_a_handle_without_estep_costs_two_passes_but_fits_the_same(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 2)

    class TwoPass:
        def __init__(self, inner):
            self.inner = inner

        def pysp_seq_log_density_sum(self, m):
            return self.inner.pysp_seq_log_density_sum(m)

        def pysp_seq_estimate(self, e, m):
            return self.inner.pysp_seq_estimate(e, m)

        def pysp_seq_initialize(self, e, r, p):
            return self.inner.pysp_seq_initialize(e, r, p)

        def close(self):
            self.inner.close()

    with encoded_data(gmm_1d, estimator=est) as h:
        # a handle with only mixle's pysp_seq_* protocol starts from its own pysp_seq_initialize
        a = fit(TwoPass(h), est, max_its=4, delta=None, seed=2)
        b = fit(h, est, max_its=4, delta=None, seed=2, init="random")
        with pytest.raises(ValueError, match="map_chunks"):
            fit(TwoPass(h), est, max_its=4, seed=2, init="kmeans++")
    assert a.init == b.init == "random"
    assert _model_bytes(a.model) == _model_bytes(b.model) and a.history == b.history
