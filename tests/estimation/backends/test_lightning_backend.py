"""backend="lightning" with real Lightning: full EM on local's bits, mini-batches through a LightningDataModule,
stochastic EM through the shared core; the same batch order and bits on mp for any worker count."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from mixle_parallel import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
)
from mixle_parallel.lightning_data import LightningEncodedData

pl = pytest.importorskip("lightning.pytorch", reason="Lightning is the optional [lightning] extra")
torch_data = pytest.importorskip("torch.utils.data", reason="torch is the optional [torch] extra")

EST = MixtureEstimator([GaussianEstimator()] * 3)
START = MixtureDistribution([GaussianDistribution(m, 4.0) for m in (-1.5, 0.5, 2.0)], [1 / 3] * 3)
QUIET = {"admission": "unverified", "audit": False}


def _rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    parts = [rng.normal(-3, 1.0, 4 * n // 10), rng.normal(0, 0.7, 3 * n // 10), rng.normal(4, 1.2, 3 * n // 10)]
    return rng.permutation(np.concatenate(parts))


X = _rows(6_000)


def test_full_em_is_local_bits_and_minibatches_come_through_a_lightning_datamodule():
    with encoded_data(X, estimator=EST, backend="lightning", batch_size=500, seed=2) as h, \
            encoded_data(X, estimator=EST, backend="local", batch_size=500, seed=2) as local:
        assert isinstance(h, LightningEncodedData) and h.backend == "lightning" and len(h) == h.size == 6000
        assert (h.batch_size, h.shuffle, h.seed, h.num_chunks) == (500, True, 2, 12)
        assert repr(h.estep(EST, START).model) == repr(local.estep(EST, START).model)
        assert h.pysp_seq_log_density_sum(START) == local.pysp_seq_log_density_sum(START)
        assert isinstance(h.datamodule, pl.LightningDataModule)
        h.datamodule.set_epoch(3)
        loader = h.datamodule.train_dataloader()
        assert isinstance(loader, torch_data.DataLoader) and list(loader) == h.minibatch_plan(epoch=3)
        plan = h.minibatch_plan(epoch=1)
        batches = list(h.minibatches(epoch=1))
        assert [len(b) for b in batches] == [500] * 12
        assert batches[0] == list(X[plan[0][0] * 500:(plan[0][0] + 1) * 500])   # raw rows of the batch's chunk
        assert sorted(r for b in batches for r in b) == sorted(X.tolist())        # one epoch: every row once
        assert [b[0] for b in h.minibatches()] == [b[0] for b in h.minibatches(epoch=2)]  # None: the next epoch
        assert plan != h.minibatch_plan(epoch=2)                                # reshuffled each epoch
    with LightningEncodedData(X, estimator=EST, shuffle=False) as d, encoded_data(X, EST, backend="pl") as alias:
        assert (d.batch_size, d.num_chunks, d.minibatch_plan()[:2]) == (600, 10, [[0], [1]])  # mixle: n // 10 rows
        assert isinstance(alias, LightningEncodedData) and alias.minibatch_plan() == encoded_data(
            X, EST, backend="lightning").minibatch_plan()


def test_batch_order_and_stochastic_bits_are_the_same_for_1_2_3_workers_on_lightning_mp_and_local():
    before = {p.pid for p in multiprocessing.active_children()}
    plans, models = set(), set()
    for backend, workers in (("mp", 1), ("mp", 2), ("local", 3)):
        with encoded_data(X, estimator=EST, backend=backend, num_workers=workers, batch_size=400, seed=5,
                          **QUIET) as h:
            assert h.num_workers == workers
            plans.add(repr([h.minibatch_plan(epoch=e) for e in range(3)]))
            models.add(repr(h.stochastic_em(EST, epochs=2, model=START)))
            assert h.last_stochastic_fit.steps == 30 and h.last_stochastic_fit.passes == 2.0
    for loader_workers in (0, 2):  # DataLoader worker processes carry the chunk ids
        with encoded_data(X, estimator=EST, backend="lightning", num_workers=loader_workers, batch_size=400,
                          seed=5) as h:
            plans.add(repr([list(h.datamodule.train_dataloader()) for _ in range(3)]))
            models.add(repr(h.stochastic_em(EST, epochs=2, model=START)))
    assert len(plans) == 1 and len(models) == 1, (plans, models)
    assert not {p.pid for p in multiprocessing.active_children()} - before  # every worker stopped


def test_stochastic_em_on_lightning_and_mp_reaches_full_em_within_1e3_per_row_in_fewer_passes():
    x = _rows(100_000)  # 1,000 steps of 100 rows in one pass (the 1M-row claim's step count, a tenth the rows)
    with encoded_data(x, estimator=EST) as full_data:  # full EM, and the judge of every fit's log-likelihood
        def per_row(model):
            return full_data.pysp_seq_log_density_sum(model)[1] / len(x)

        opt = MixtureDistribution([GaussianDistribution(m, 1.0) for m in (-3.0, 0.0, 4.0)], [1 / 3] * 3)
        for _ in range(12):  # full EM from a start next to the optimum: converged
            opt = full_data.estep(EST, opt).model
        full = START
        for _ in range(5):
            full = full_data.estep(EST, full).model
        best, full_gap = per_row(opt), per_row(opt) - per_row(full)
        with encoded_data(x, estimator=EST, backend="lightning", batch_size=100, seed=1) as h:
            on_lightning, fit = h.stochastic_em(EST, epochs=1, model=START), h.last_stochastic_fit
        with encoded_data(x, estimator=EST, backend="mp", num_workers=2, batch_size=100, seed=1, **QUIET) as m:
            on_mp, mp_fit = m.stochastic_em(EST, epochs=1, model=START), m.last_stochastic_fit
        lightning_gap, mp_gap = best - per_row(on_lightning), best - per_row(on_mp)
    assert (fit.steps, fit.passes) == (mp_fit.steps, mp_fit.passes) == (1000, 1.0)
    assert repr(on_mp) == repr(on_lightning)            # the same bits: same batches, folded in chunk order
    assert lightning_gap < 1e-3 and mp_gap < 1e-3, (lightning_gap, mp_gap)   # one pass of stepwise EM ...
    assert full_gap > 1e-3, full_gap                    # ... where five passes of full EM from the same start are not


@pytest.mark.parametrize("backend", ["lightning", "mp", "local"])
@pytest.mark.parametrize("option, value, error, text", [
    ("batch_size", 0, ValueError, "batch_size must be an int >= 1 (rows per mini-batch), got 0"),
    ("batch_size", 2.5, ValueError, "batch_size must be an int >= 1 (rows per mini-batch), got float 2.5"),
    ("batch_size", True, ValueError, "batch_size must be an int >= 1 (rows per mini-batch), got the bool True"),
    ("shuffle", "yes", TypeError, "shuffle must be True or False"),
    ("shuffle", 1, TypeError, "shuffle must be True or False"),
    ("seed", -1, ValueError, "seed must be an int >= 0 (the seed of the batch order), got -1"),
    ("seed", 1.5, ValueError, "seed must be an int >= 0"),
])
def test_bad_minibatch_options_are_refused_before_anything_starts(backend, option, value, error, text):
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        encoded_data(X, estimator=EST, backend=backend, num_workers=2, **{option: value}, **QUIET)
    assert not {p.pid for p in multiprocessing.active_children()} - before


def test_lightning_refuses_what_it_does_not_honour_and_bad_loader_workers():
    with pytest.raises(ValueError, match="num_workers \\(DataLoader worker processes\\) must be >= 0, got -1"):
        encoded_data(X, estimator=EST, backend="lightning", num_workers=-1)
    with pytest.raises(ValueError, match="option timeout= is not honoured by backend 'lightning'"):
        encoded_data(X, estimator=EST, backend="lightning", timeout=3.0)
    every = "dask, lightning, local, mp, mpi, ray, spark, torchrun"
    with pytest.raises(ValueError, match=f"option batch_size= is not honoured by backend 'model_parallel'; "
                                         f"backends honouring it: {every}"):
        encoded_data(X, estimator=EST, backend="model_parallel", batch_size=100)
    with encoded_data(X, estimator=EST, backend="lightning", batch_size=600) as h:
        with pytest.raises(ValueError, match="epoch must be an int >= 0 or None, got -2"):
            h.minibatches(epoch=-2)
        with pytest.raises(ValueError, match="epochs must be a finite number > 0"):
            h.stochastic_em(EST, epochs=0)
        with pytest.raises(ValueError, match=r"schedule\(2\) returned 1.5; a step size must be finite and in \(0, 1\]"):
            h.stochastic_em(EST, epochs=1, schedule=lambda t: 1.5)


def test_mixle_objects_fit_by_stochastic_em_and_come_back_as_mixle_distributions():
    stats = pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")
    x = np.random.default_rng(0).normal(2.0, 3.0, size=5_000)
    with LightningEncodedData(x, stats.GaussianEstimator(), batch_size=500, seed=4) as h:
        model = h.stochastic_em(stats.GaussianEstimator(), epochs=2)
    assert isinstance(model, stats.GaussianDistribution) and h.last_stochastic_fit.steps == 20
    assert abs(model.mu - 2.0) < 0.2 and abs(model.sigma2 - 9.0) < 1.0
