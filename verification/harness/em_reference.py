"""The independent EM reference: a Gaussian mixture fitted in one piece by a plain numpy loop.

No chunks, no runner, no backend and none of the executors' model code: the E-step is the
textbook log-sum-exp posterior over the whole sample, the M-step the weighted maximum-likelihood
update. Each step yields the observables every EM executor reports for the ``gaussian_mixture``
workload (``EM_OBSERVABLE_KEYS``): the combined sufficient statistics and the new parameters.

Chunked sums are a different summation order than one sum over the whole sample, so an executor
agrees with this reference only up to rounding; ``EM_REFERENCE_TOLERANCE`` states the bound.
Sameness across worker counts is a separate, bitwise check in the harness.
"""

from __future__ import annotations

import numpy as np

from ...contracts import Tolerance

__all__ = ["EM_OBSERVABLE_KEYS", "EM_REFERENCE_TOLERANCE", "MIN_VARIANCE", "gaussian_mixture_reference"]

EM_OBSERVABLE_KEYS = (
    "stats/weight_sums", "stats/sum_x", "stats/sum_xx", "param/weights", "param/means", "param/variances",
)
"""What an EM trial returns under ``stats:data`` per step, each a float64 array of one value per component."""

MIN_VARIANCE = 1e-12
"""Variance floor of the M-step (the built-in GaussianEstimator's default ``min_var``)."""

EM_REFERENCE_TOLERANCE = Tolerance(
    atol=1e-9,
    rtol=1e-9,
    source=(
        "mixle-parallel bound for float64 EM against a one-piece reference: n=800 rows summed in a "
        "different order differ by at most about n*eps*sum|x| (~2e-13 relative); three EM steps "
        "amplify that by well under 1e3, so 1e-9 absolute and relative leaves margin and still "
        "refuses a dropped row (relative change ~1e-3) or a perturbed statistic"
    ),
)
"""The stated fp64 bound for EM statistics and parameters against the one-piece reference."""


def _log_normal(x: np.ndarray, means: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """(n, k) matrix of log N(x_i; mean_k, variance_k)."""
    diff = x[:, None] - means[None, :]
    return -0.5 * (np.log(2.0 * np.pi * variances)[None, :] + diff * diff / variances[None, :])


def gaussian_mixture_reference(
    data: np.ndarray, weights: np.ndarray, means: np.ndarray, variances: np.ndarray, steps: int
) -> list[dict[str, np.ndarray]]:
    """``steps`` EM iterations of a 1-D Gaussian mixture over all of ``data`` at once (float64)."""
    x = np.asarray(data, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"the Gaussian-mixture reference takes a 1-D sample, got shape {x.shape}")
    w, mu, var = (np.array(a, dtype=np.float64, copy=True) for a in (weights, means, variances))
    out: list[dict[str, np.ndarray]] = []
    for _ in range(steps):
        log_joint = np.log(w)[None, :] + _log_normal(x, mu, var)
        peak = log_joint.max(axis=1, keepdims=True)
        resp = np.exp(log_joint - peak)
        resp /= resp.sum(axis=1, keepdims=True)
        sw = resp.sum(axis=0)
        sx = (resp * x[:, None]).sum(axis=0)
        sxx = (resp * (x * x)[:, None]).sum(axis=0)
        live = sw > 0.0
        safe = np.where(live, sw, 1.0)
        mu = np.where(live, sx / safe, 0.0)
        var = np.where(live, np.maximum(np.maximum(sxx / safe - mu * mu, 0.0), MIN_VARIANCE), 1.0)
        total = float(sw.sum())
        w = sw / total if total > 0.0 else np.full(len(sw), 1.0 / len(sw))
        out.append({"stats/weight_sums": sw, "stats/sum_x": sx, "stats/sum_xx": sxx,
                    "param/weights": w.copy(), "param/means": mu.copy(), "param/variances": var.copy()})
    return out
