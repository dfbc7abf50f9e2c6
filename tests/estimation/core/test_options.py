"""encoded_data options: each backend honours what it declares, the rest raise naming who honours them.

Also: ``sub_chunks`` as mixle defines it, ``num_workers`` capped to what a backend can use, and bad
rows refused before any worker starts.
"""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, encoded_data
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.handle import handle_from_runner
from mixle_parallel.executors.estimation.optimize import fit
from mixle_parallel.executors.estimation.options import EncodedDataOptions, declare_backend_options
from mixle_parallel.executors.registry import register_encoded_data_backend

X = np.random.default_rng(3).normal(size=400)
EST = GaussianEstimator()


def test_precision_is_honoured_as_fp64_and_anything_else_is_refused():
    plain = fit(X, MixtureEstimator([EST] * 2), max_its=3, seed=1)
    fp64 = fit(X, MixtureEstimator([EST] * 2), max_its=3, seed=1, precision="fp64")
    assert plain.history == fp64.history
    with pytest.raises(ValueError, match="precision='fp16' is not honoured by backend 'local'"):
        encoded_data(X, estimator=EST, precision="fp16")


def test_an_option_of_another_backend_names_the_backends_that_honour_it():
    with pytest.raises(ValueError, match="option comm= is not honoured by backend 'local'; backends honouring it: mpi"):
        encoded_data(X, estimator=EST, comm=object())
    with pytest.raises(ValueError, match="option timeout= .* backends honouring it: dask, mp, mpi, ray, spark"):
        encoded_data(X, estimator=EST, timeout=5.0)
    with pytest.raises(ValueError, match="option start_method= is not honoured by backend 'dask'"):
        encoded_data(X, estimator=EST, backend="dask", start_method="fork")
    with pytest.raises(ValueError, match="option colour= .* no backend takes such a keyword"):
        encoded_data(X, estimator=EST, colour="blue")


def test_options_object_is_the_same_as_keywords():
    opts = EncodedDataOptions(estimator=EST, num_chunks=4, num_workers=2)
    with encoded_data(X, options=opts) as a, encoded_data(X, estimator=EST, num_chunks=4, num_workers=2) as b:
        assert (a.num_chunks, a.num_workers) == (b.num_chunks, b.num_workers) == (4, 2)
    with pytest.raises(ValueError, match="num_chunks given both as keywords and in options="):
        encoded_data(X, options=opts, num_chunks=3)
    with encoded_data(X, options=EncodedDataOptions(estimator=EST, engine="torch:cpu")) as t:
        assert t.engine is not None and t.engine.name == "torch"
    with pytest.raises(ValueError, match="option engine= is not honoured by backend 'dask'"):
        encoded_data(X, backend="dask", options=EncodedDataOptions(estimator=EST, engine="torch"))
    with encoded_data(X, options=EncodedDataOptions(estimator=EST, batch_size=50, seed=3)) as c:
        assert (c.num_chunks, c.minibatch.batch_size, c.minibatch.seed) == (8, 50, 3)  # a mini-batch is a chunk


def test_a_third_party_backend_gets_what_it_declares():
    seen = {}

    def factory(data, colour=None, **params):  # an engine keyword is the factory's: handle_from_runner takes options
        seen.update(params, colour=colour)
        return handle_from_runner(LocalChunkRunner(1), data, **params)

    register_encoded_data_backend("opts_probe", factory, override=True)
    with encoded_data(X, estimator=EST, backend="opts_probe", colour="blue"):  # undeclared: receives everything
        assert seen["colour"] == "blue"
    declare_backend_options("opts_probe", ["colour"])
    with pytest.raises(ValueError, match="option batch_size= is not honoured by backend 'opts_probe'"):
        encoded_data(X, estimator=EST, backend="opts_probe", batch_size=4)


def test_sub_chunks_as_mixle_defines_it():
    with encoded_data(X, estimator=EST, sub_chunks=8) as h:
        assert h.num_chunks == 8
    with encoded_data(X, estimator=EST, num_chunks=2, sub_chunks=3) as h:
        assert h.num_chunks == 6
    with encoded_data(X, estimator=EST, chunk_size=100, sub_chunks=2) as h:
        assert h.num_chunks == 8


def test_too_many_workers_are_capped_with_a_warning():
    before = threading.active_count()
    with pytest.warns(UserWarning, match="cannot use num_workers=1000000 here; running"):
        h = encoded_data(X, estimator=EST, num_workers=10**6)
    with h:
        assert 1 <= h.num_workers <= 256
        fit(h, MixtureEstimator([EST] * 2), max_its=2)
        assert threading.active_count() - before <= h.num_workers
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        encoded_data(X, estimator=EST, num_workers=0)


@pytest.mark.parametrize("rows, message", [
    (np.zeros(0), "data has no rows"),
    ([], "data has no rows"),
    (np.array([1.0, 2.0, np.nan, 3.0]), "data row 2, column 0 is nan"),
    (np.array([[1.0, 2.0], [3.0, np.inf]]), "data row 1, column 1 is inf"),
    (np.array([1.0 + 2j, 3.0]), "data is complex"),
    (np.array(["a", "b"]), "string values where numbers are needed"),
    (np.array([1.0, "x"], dtype=object), "object values where numbers are needed"),
])
def test_bad_rows_are_refused_before_any_worker_starts(rows, message):
    est = MixtureEstimator([EST] * 2)
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=message):
        fit(rows, est, backend="mp", num_workers=2, admission="unverified")
    assert set(multiprocessing.active_children()) <= before
    with pytest.raises(ValueError, match=message):
        encoded_data(rows, estimator=est)
