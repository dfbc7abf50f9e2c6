"""CUDA check for the torch EM engine: every model kind on ``engine="torch:cuda"`` against the numpy engine.

Needs one CUDA device; skipped on CPU-only machines. Run: ``pytest -m device tests/device``.
Bounds expected (the CPU ones, ``tests/estimation/core/torch_engine_cases``): fp64 within 1e-12
(normwise per statistic; relative for the log-likelihood), fp32 within 1e-4 (statistics) and 1e-6
(log-likelihood), with TF32 off (torch's default). What it proves that the CPU tests cannot: the
kernels run on the GPU, chunk tensors are cached there, a chunk's statistics are the same bits over
repeated passes and worker threads (categorical counts use the deterministic ``index_put_``), and
spawned mp workers each drive the GPU with the same bits as the driver.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

from mixle_parallel.contracts.estimation import statistic_digest  # noqa: E402
from mixle_parallel.executors.estimation import encoded_data  # noqa: E402
from mixle_parallel.executors.estimation.optimize import fit  # noqa: E402
from tests.estimation.core.torch_engine_cases import (  # noqa: E402
    FP32_LL_RTOL,
    FP32_STATS_RTOL,
    FP64_RTOL,
    cases,
    normwise_errors,
)

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]

CASES = cases()
BOUNDS = {"fp64": (FP64_RTOL, FP64_RTOL), "fp32": (FP32_STATS_RTOL, FP32_LL_RTOL)}


def _passes(name: str, engine: str | None, precision: str | None, workers: int = 1) -> list[tuple]:
    """Two E-steps of the case's model, then its log-density sum: [(ll, stats, digest), ...], ld."""
    rows, est, model = CASES[name]
    with encoded_data(rows, estimator=est, engine=engine, precision=precision, num_workers=workers,
                      audit=False, admission="unverified") as h:
        out = []
        for _ in range(2):
            r = h.estep(est, model)
            out.append((r.log_likelihood, r.stats, statistic_digest(r.stats)))
        if engine is not None:
            assert h.engine is not None and h.engine.device.startswith("cuda"), h.engine
        out.append(h.pysp_seq_log_density_sum(model)[1])
    return out


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_model_kind_on_cuda_within_the_bound_of_the_numpy_engine(name, precision):
    (ll, stats, _), _, ld = _passes(name, None, None)
    first, second, t_ld = _passes(name, "torch:cuda", precision)
    stats_rtol, ll_rtol = BOUNDS[precision]
    errors = normwise_errors(first[1], stats)
    assert max(errors) <= stats_rtol, (name, precision, errors)
    assert abs(first[0] - ll) <= ll_rtol * abs(ll), (name, precision, first[0], ll)
    assert abs(t_ld - ld) <= ll_rtol * abs(ld), (name, precision, t_ld, ld)
    assert first[2] == second[2]  # the same bits on the second pass (tensors now from the device cache)


@pytest.mark.parametrize("name", ["categorical_mixture", "full_mixture", "gaussian_mixture"])
def test_cuda_statistics_are_the_same_bits_for_any_worker_thread_count(name):
    one = _passes(name, "torch:cuda", "fp64", workers=1)
    three = _passes(name, "torch:cuda", "fp64", workers=3)
    assert one[0][2] == three[0][2] and one[1][2] == three[1][2]


def test_plain_torch_picks_the_gpu_and_caches_chunk_tensors_there():
    rows, est, model = CASES["full_mixture"]
    from mixle_parallel.executors.estimation.backends import torch_engine

    with encoded_data(rows, estimator=est, engine="torch", admission="unverified") as h:
        assert h.engine is not None and h.engine.device == f"cuda:{torch.cuda.current_device()}"
        h.estep(est, model)
        assert torch_engine._CACHE.used >= rows.size * 8  # every chunk's rows resident on the GPU (fp64)
    assert torch_engine._CACHE.used == 0  # closing the handle released them


def test_mp_workers_on_one_gpu_give_the_drivers_bits():
    rows, est, _ = CASES["diagonal_mixture"]
    local = fit(rows, est, max_its=3, seed=4, delta=None, engine="torch:cuda", num_chunks=4)
    remote = fit(rows, est, max_its=3, seed=4, delta=None, engine="torch:cuda", num_chunks=4, backend="mp",
                 num_workers=2, admission="unverified")
    assert remote.history == local.history
    assert statistic_digest(remote.model.params()) == statistic_digest(local.model.params())
    assert not remote.quarantined  # the SDC audit's peer replays matched bit for bit
