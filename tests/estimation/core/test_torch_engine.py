"""The torch compute engine of the EM E-step (``engine="torch"``) on the CPU, against the numpy engine.

Bounds (stated in ``torch_engine_cases``): fp64 within 1e-12 (normwise per statistic, relative for the
log-likelihood), fp32 within 1e-4 / 1e-6. Same bits on every worker count and backend (local threads,
mp processes) for one engine and precision; bad engine names, precisions and kernel-less models are
refused before any worker starts.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch EM engine needs the optional [torch] extra")

from mixle_parallel.contracts.estimation import statistic_digest  # noqa: E402
from mixle_parallel.executors.estimation import (  # noqa: E402
    CompositeEstimator,
    ExponentialEstimator,
    GaussianEstimator,
    MixtureEstimator,
    PoissonEstimator,
    encoded_data,
)
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner  # noqa: E402
from mixle_parallel.executors.estimation.em_pass.engine_choice import EngineChoice, resolve_engine  # noqa: E402
from mixle_parallel.executors.estimation.handle import handle_from_runner  # noqa: E402
from mixle_parallel.executors.estimation.optimize import fit  # noqa: E402
from mixle_parallel.verification.ledger.chain import read_ledger  # noqa: E402
from tests.estimation.core.torch_engine_cases import (  # noqa: E402
    FP32_LL_RTOL,
    FP32_STATS_RTOL,
    FP64_RTOL,
    cases,
    normwise_errors,
)

CASES = cases()


def _one_pass(name: str, **engine: object) -> tuple[float, object, float]:
    rows, est, model = CASES[name]
    with encoded_data(rows, estimator=est, **engine) as h:
        result = h.estep(est, model)
        _, ld_sum = h.pysp_seq_log_density_sum(model)
    return result.log_likelihood, result.stats, ld_sum


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_model_kind_matches_the_numpy_engine_in_fp64_and_fp32(name):
    ll, stats, ld = _one_pass(name)
    for precision, stats_rtol, ll_rtol in (("fp64", FP64_RTOL, FP64_RTOL), ("fp32", FP32_STATS_RTOL, FP32_LL_RTOL)):
        t_ll, t_stats, t_ld = _one_pass(name, engine="torch", precision=precision)
        errors = normwise_errors(t_stats, stats)
        assert max(errors) <= stats_rtol, (precision, errors)
        assert abs(t_ll - ll) <= ll_rtol * abs(ll), (precision, t_ll, ll)
        assert abs(t_ld - ld) <= ll_rtol * abs(ld), (precision, t_ld, ld)


def test_rows_no_component_can_produce_score_minus_inf_and_weigh_nothing_as_on_numpy():
    rows, est, model = CASES["categorical_mixture"]
    rows = rows[:200] + ["z"]  # "z" is in neither component's table (default_value 0)
    for engine in (None, "torch"):
        with encoded_data(rows, estimator=est, engine=engine, num_chunks=2) as h:
            out = h.estep(est, model)
            assert out.log_likelihood == -np.inf
            assert out.stats[1][0]["z"] == 0.0 and out.stats[1][1]["z"] == 0.0 and sum(out.stats[0]) == 200.0


def test_fp32_computes_in_single_precision_and_fp64_is_the_default():
    name = "gaussian_mixture"
    default, fp64, fp32 = (_one_pass(name, engine="torch", **p) for p in ({}, {"precision": "fp64"},
                                                                          {"precision": "float32"}))
    assert statistic_digest(default[1]) == statistic_digest(fp64[1])
    assert statistic_digest(fp32[1]) != statistic_digest(fp64[1])


def test_a_fit_on_the_torch_engine_reaches_the_numpy_fit():
    rows, est, _ = CASES["diagonal_mixture"]
    ours = fit(rows, est, max_its=8, seed=3, delta=None)
    torched = fit(rows, est, max_its=8, seed=3, delta=None, engine="torch")
    assert np.allclose(torched.history, ours.history, rtol=1e-10, atol=0.0)
    for a, b in zip(torched.model.components, ours.model.components):
        assert np.allclose(a.mu, b.mu, rtol=1e-9) and np.allclose(a.var, b.var, rtol=1e-9)


def test_same_bits_for_any_thread_count_and_the_callers_torch_threads_are_restored():
    rows, est, model = CASES["full_mixture"]
    digests = set()
    before = torch.get_num_threads()
    try:
        for threads, workers in ((1, 1), (2, 1), (2, 3)):
            torch.set_num_threads(threads)
            with encoded_data(rows, estimator=est, engine="torch", num_workers=workers, audit=False,
                              admission="unverified") as h:
                digests.add(statistic_digest(h.estep(est, model).stats))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert len(digests) == 1


def test_the_sdc_audit_replays_torch_chunks_bit_for_bit_on_another_worker_and_the_ledger_names_the_engine(
        tmp_path):
    rows, est, model = CASES["categorical_mixture"]
    with encoded_data(rows, estimator=est, engine="torch", precision="fp32", num_workers=2, num_chunks=4,
                      audit=True, audit_rate=1.0, admission="unverified", ledger=tmp_path / "em.jsonl") as h:
        h.estep(est, model)
        assert h.last_audit_records and all(r.matched for r in h.last_audit_records)
    start = read_ledger(tmp_path / "em.jsonl").entries[0]
    assert start.kind == "run_start" and start.payload["extra"]["engine"] == "torch:cpu (fp32)"


@pytest.mark.slow  # ~25 s here: each spawned mp worker imports torch (~7 s on this machine)
def test_mp_workers_give_the_same_bits_as_the_local_engine():
    rows, est, _ = CASES["poisson_mixture"]
    local = fit(rows, est, max_its=3, seed=2, delta=None, engine="torch", num_chunks=4)
    before = {p.pid for p in multiprocessing.active_children()}
    remote = fit(rows, est, max_its=3, seed=2, delta=None, engine="torch", num_chunks=4, backend="mp",
                 num_workers=2, admission="unverified")
    assert remote.history == local.history
    assert statistic_digest(remote.model.params()) == statistic_digest(local.model.params())
    assert not remote.quarantined
    assert not ({p.pid for p in multiprocessing.active_children()} - before)


# ---- refusals, all before any worker starts -------------------------------------------------------------
def _refused(match: str, **kwargs: object) -> None:
    before = {p.pid for p in multiprocessing.active_children()}
    rows = kwargs.pop("rows", CASES["gaussian"][0])
    kwargs.setdefault("estimator", GaussianEstimator())
    with pytest.raises(ValueError, match=match):
        encoded_data(rows, admission="unverified", **kwargs)
    assert not ({p.pid for p in multiprocessing.active_children()} - before)


def test_unknown_engines_and_devices_are_refused_naming_the_engines():
    _refused(r"unknown EM engine 'jax'; engines: numpy, torch", engine="jax", backend="mp", num_workers=2)
    _refused(r"runs on 'cpu' or 'cuda\[:<i>\]', got device 'tpu'", engine="torch:tpu")
    _refused(r"the numpy engine runs on the cpu only", engine="numpy:cuda")
    _refused(r"engine= must be an engine name", engine=3)
    if not torch.cuda.is_available():
        _refused(r"engine 'torch:cuda' needs a CUDA device and torch sees none", engine="torch:cuda",
                 backend="mp", num_workers=2)


def test_precisions_are_refused_naming_the_engine():
    _refused(r"precision='fp16' is not supported by engine 'torch': it computes in fp64 or fp32",
             engine="torch", precision="fp16")
    _refused(r"precision='bf16' is not supported by engine 'torch'", engine="torch", precision="bf16",
             backend="mp", num_workers=2)
    _refused(r"precision='fp32' is not honoured by backend 'local': its engine 'numpy' computes in float64 only",
             precision="fp32")
    _refused(r"precision='fp32' is not honoured by backend 'mp'", precision="fp32", engine="numpy",
             backend="mp", num_workers=2)


def test_models_without_a_torch_kernel_are_refused_naming_the_model():
    _refused(r"engine='torch' has no E-step kernel for ExponentialEstimator; it has kernels for GaussianEstimator",
             engine="torch", estimator=ExponentialEstimator(), backend="mp", num_workers=2)
    _refused(r"no E-step kernel for a mixture with component\(s\) ExponentialEstimator",
             engine="torch", estimator=MixtureEstimator([GaussianEstimator(), ExponentialEstimator()]))
    _refused(r"no E-step kernel for a mixture whose components read different rows \(counts, scalar rows\)",
             engine="torch", estimator=MixtureEstimator([GaussianEstimator(), PoissonEstimator()]))
    _refused(r"no E-step kernel for CompositeEstimator", engine="torch",
             rows=[(1.0, 2.0)] * 10, estimator=CompositeEstimator([GaussianEstimator()] * 2))
    mixle_stats = pytest.importorskip("mixle.stats", reason="mixle 0.8.2 is the compatibility reference")
    _refused(r"no E-step kernel for mixle's GaussianEstimator \(mixle_parallel.GaussianEstimator has one\)",
             engine="torch", estimator=mixle_stats.GaussianEstimator())


def test_a_handle_refuses_a_kernel_less_estimator_at_its_estep_too():
    rows = CASES["gaussian"][0]
    with encoded_data(rows[:100], estimator=GaussianEstimator(), engine="torch") as h:
        with pytest.raises(ValueError, match="no E-step kernel for ExponentialEstimator"):
            h.estep(ExponentialEstimator(), None)


def test_backends_without_the_engine_option_refuse_it_naming_those_that_have_it():
    _refused(r"option engine= is not honoured by backend 'dask'; backends honouring it: local, mp",
             engine="torch", backend="dask")


def test_a_backend_author_can_ask_handle_from_runner_for_the_torch_engine():
    rows, est, model = CASES["poisson"]
    with handle_from_runner(LocalChunkRunner(2), rows, estimator=est, engine="torch:cpu", precision="fp32") as h:
        assert h.engine == EngineChoice("torch", "cpu", "fp32")
        torched = h.estep(est, model).stats
    with encoded_data(rows, estimator=est, engine="torch:cpu", precision="fp32") as h:
        assert statistic_digest(h.estep(est, model).stats) == statistic_digest(torched)
    with pytest.raises(ValueError, match="no E-step kernel for ExponentialEstimator"):
        handle_from_runner(LocalChunkRunner(1), rows, estimator=ExponentialEstimator(), engine="torch")


def test_engine_names_and_mixle_engine_objects_resolve():
    assert resolve_engine(None, None) is None and resolve_engine("numpy", "fp64") is None
    assert resolve_engine("torch", None) == EngineChoice("torch", None, "fp64")
    assert resolve_engine("Torch:CPU", torch.float32) == EngineChoice("torch", "cpu", "fp32")
    assert resolve_engine("torch:cuda:1", "double") == EngineChoice("torch", "cuda:1", "fp64")
    mixle_engines = pytest.importorskip("mixle.engines", reason="mixle 0.8.2 is the compatibility reference")
    assert resolve_engine(mixle_engines.TorchEngine(device="cpu", dtype="float32"), None) == EngineChoice(
        "torch", "cpu", "fp32")
    assert resolve_engine(mixle_engines.NumpyEngine(), None) is None
