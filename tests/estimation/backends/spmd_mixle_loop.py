"""mixle 0.8.2's own ``optimize`` driving an SPMD handle (mpi, torchrun): what each rank of a test job runs.

mixle's loop scores the start with ``pysp_seq_log_density_sum``, then repeats an E-step (``pysp_seq_estimate``)
and a log-density pass; every rank must run the same collectives in the same order throughout, with the SDC
audit on (its default for two ranks or more). ``local_params`` is the same loop over a one-worker local handle,
whose bits every backend and worker count must reproduce (the fixed two-level combine order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.estimation.backends import em_case

CHUNK_SIZE = 250
"""4,000 rows in 16 chunks, as in ``em_case``: blocks of 8/8 on two ranks, 5/5/6 on three."""
MAX_ITS = 30


def mixle_objects(model_parallel: bool) -> tuple[Any, Any]:
    """mixle's 3-component Gaussian mixture estimator (wrapped in our ``ModelParallelEstimator`` when asked)
    and a fixed mixle start model (``prev_estimate``)."""
    import mixle.stats as ms

    from mixle_parallel.model_parallel import ModelParallelEstimator

    est = em_case.mixle_estimator()
    start = ms.MixtureDistribution([ms.GaussianDistribution(-5.0, 2.0), ms.GaussianDistribution(0.0, 1.0),
                                    ms.GaussianDistribution(5.0, 3.0)], [1 / 3] * 3)
    return (ModelParallelEstimator(est) if model_parallel else est), start


def params_hex(model: Any) -> str:
    """The bits of a mixle mixture of Gaussians: (mu, sigma2, weight) per component."""
    rows = [[c.mu, c.sigma2, w] for c, w in zip(model.components, model.w)]
    return np.array(rows, dtype=np.float64).tobytes().hex()


def drive(handle: Any, est: Any, start: Any) -> dict[str, Any]:
    """Fit with mixle's own ``optimize(None, est, enc_data=handle, prev_estimate=start)``; what each rank reports."""
    from mixle.inference.estimation import optimize

    model = optimize(None, est, enc_data=handle, prev_estimate=start, max_its=MAX_ITS)
    records = handle.audit_records
    return {"params": params_hex(model), "estimator": type(est).__name__, "audited": handle.audit is not None,
            "audit_records": len(records), "audit_mismatches": sum(1 for r in records if not r.matched),
            "esteps": handle.iteration, "steps": _steps(handle.runner)}


def _steps(runner: Any) -> int | None:
    """Collective steps the runner's schedule counted (None where a runner keeps no schedule)."""
    schedule = getattr(runner, "schedule", None)
    return None if schedule is None else int(schedule.steps)


def local_params(est: Any, start: Any) -> str:
    """The same mixle loop over a one-worker local handle of the same chunks: the bits every rank must end on."""
    from mixle.inference.estimation import optimize

    from mixle_parallel import encoded_data

    with encoded_data(em_case.data(), estimator=est, chunk_size=CHUNK_SIZE, num_workers=1,
                      admission="unverified") as handle:
        return params_hex(optimize(None, est, enc_data=handle, prev_estimate=start, max_its=MAX_ITS))


def diverge(handle: Any, est: Any, start: Any, rank: int) -> dict[str, str]:
    """Force the ranks apart: rank 0 scores the data (a log-density pass), every other rank runs an E-step.
    What each rank raised (every rank must raise the same clear error, none a ``TypeError`` from a chunk)."""
    try:
        if rank == 0:
            handle.pysp_seq_log_density_sum(start)
        else:
            handle.pysp_seq_estimate(est, start)
    except Exception as exc:  # noqa: BLE001 - reported to the test, which judges it
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": "", "message": "no error"}
