"""mixle 0.8.2's EM names and shapes: facade modules of its submodule names, the reference handle classes."""

from __future__ import annotations

import importlib
import io
import sys

import numpy as np
import pytest

import mixle_parallel
from mixle_parallel.contracts import Resources
from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, encoded_data, fit
from mixle_parallel.executors.estimation.models._base import model_digest

FACADES = ["planner", "model_parallel", "mpi", "multiprocessing"]
X = np.random.default_rng(5).normal(size=900)


@pytest.mark.parametrize("sub", FACADES)
def test_facade_modules_re_export_the_one_implementation(sub):
    facade = importlib.import_module(f"mixle_parallel.{sub}")
    for name in facade.__all__:
        assert getattr(facade, name) is getattr(mixle_parallel, name), name


@pytest.mark.parametrize("sub", FACADES)
def test_facade_names_are_mixles(sub):
    mixle_module = pytest.importorskip(f"mixle.utils.parallel.{sub}") if sub != "mpi" else None
    facade = importlib.import_module(f"mixle_parallel.{sub}")
    if mixle_module is not None:
        ours_only = set(facade.__all__) - set(mixle_module.__all__)
        assert ours_only <= {"EncodedDataOptions"}, ours_only
    else:
        assert set(facade.__all__) == {"MPIEncodedData", "mpi_out"}


def _gmm():
    return MixtureEstimator([GaussianEstimator()] * 2)


def test_local_encoded_data_is_encoded_data_by_another_name():
    from mixle_parallel.planner import LocalEncodedData

    with LocalEncodedData(X, _gmm(), sub_chunks=4) as h, encoded_data(X, estimator=_gmm(), num_chunks=4) as g:
        assert isinstance(h, LocalEncodedData) and h.num_chunks == 4
        a, b = fit(h, _gmm(), max_its=4, seed=2), fit(g, _gmm(), max_its=4, seed=2)
    assert model_digest(a.model) == model_digest(b.model) and a.history == b.history


def test_mp_encoded_data_positional_shape_and_same_bits():
    from mixle_parallel.multiprocessing import MPEncodedData

    with MPEncodedData(X, _gmm(), None, 2, admission="unverified", response_timeout=60.0) as h:
        assert isinstance(h, MPEncodedData) and h.num_workers == 2 and h.backend == "mp"
        got = fit(h, _gmm(), max_its=4, seed=2)
    ref = fit(X, _gmm(), max_its=4, seed=2)
    assert model_digest(got.model) == model_digest(ref.model) and got.history == ref.history


def test_dask_and_spark_handles_refuse_what_they_cannot_honour():
    from mixle_parallel.planner import DaskEncodedData, SparkEncodedData

    with pytest.raises(TypeError, match="takes the rows in memory"):
        DaskEncodedData(iter([1.0, 2.0]), _gmm())
    with pytest.raises(ValueError, match="materialize=False"):
        SparkEncodedData(X, _gmm(), materialize=False)


def test_model_parallel_accumulator_seq_update_is_update():
    from mixle_parallel.model_parallel import ModelParallelEstimator

    est = ModelParallelEstimator(_gmm(), 2)
    model = fit(X, _gmm(), max_its=2, seed=0).model
    enc = est.encoder().encode(X)
    a, b = est.accumulator_factory().make(), est.accumulator_factory().make()
    a.update(enc, None, model)
    b.seq_update(enc, None, model)
    assert model_digest(est.estimate(None, a.value())) == model_digest(est.estimate(None, b.value()))


def test_resources_from_dask_works_with_any_scheduler_info():
    class OldClient:  # a client whose scheduler_info() takes no n_workers
        def scheduler_info(self):
            return {"workers": {"tcp://a:1": {"nthreads": 2}, "tcp://b:2": {"nthreads": 1}}}

    assert len(Resources.from_dask(OldClient())) == 3


def test_mpi_out_prints_on_the_root_only():
    from mixle_parallel.mpi import mpi_out

    class Comm:
        def __init__(self, rank):
            self.rank = rank

        def Get_rank(self):  # noqa: N802 - mpi4py's name
            return self.rank

    assert mpi_out(Comm(0)) is sys.stdout
    assert isinstance(mpi_out(Comm(1)), io.StringIO)
    assert isinstance(mpi_out(Comm(0), root=1), io.StringIO)
