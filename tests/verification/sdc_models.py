"""Tiny deterministic numpy 'models' for the SDC tests: a linear regression gradient and a 1-D GMM E-step."""

from __future__ import annotations

import numpy as np

N_FEATURES = 6


def batch(rank: int, step: int, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """This rank's batch at ``step`` (a pure function of both)."""
    rng = np.random.default_rng([rank, step])
    x = rng.standard_normal((n, N_FEATURES)).astype(np.float32)
    return x, (x @ np.arange(1, N_FEATURES + 1, dtype=np.float32) + 0.1).astype(np.float32)


def local_gradients(params: dict[str, np.ndarray], rank: int, step: int) -> dict[str, np.ndarray]:
    """Mean squared error gradients for ``params`` on this rank's batch."""
    x, y = batch(rank, step)
    err = x @ params["w"] + params["b"] - y
    return {"w": (2.0 * x.T @ err / len(y)).astype(np.float32), "b": np.array([2.0 * err.mean()], dtype=np.float32)}


def initial_params() -> dict[str, np.ndarray]:
    """Fixed starting parameters."""
    return {"w": np.zeros(N_FEATURES, dtype=np.float32), "b": np.zeros(1, dtype=np.float32)}


def gmm_data(n: int = 800, seed: int = 0) -> np.ndarray:
    """A two-component 1-D mixture sample."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-2.0, 0.7, n // 2), rng.normal(1.5, 1.0, n - n // 2)])


def gmm_chunk_stats(
    data: np.ndarray, num_chunks: int, chunk: int, model: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """E-step sufficient statistics of one chunk (fresh arrays every call)."""
    x = np.array_split(data, num_chunks)[chunk][:, None]
    logp = -0.5 * (x - model["mu"]) ** 2 / model["var"] - 0.5 * np.log(2 * np.pi * model["var"]) + np.log(model["w"])
    resp = np.exp(logp - logp.max(axis=1, keepdims=True))
    resp /= resp.sum(axis=1, keepdims=True)
    return {"n": resp.sum(0), "sx": (resp * x).sum(0), "sxx": (resp * x * x).sum(0)}


def gmm_combine(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add two statistics."""
    return {k: a[k] + b[k] for k in a}


def gmm_m_step(stats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """New parameters from combined statistics."""
    mu = stats["sx"] / stats["n"]
    return {"w": stats["n"] / stats["n"].sum(), "mu": mu, "var": stats["sxx"] / stats["n"] - mu * mu}


GMM_INIT = {"w": np.array([0.5, 0.5]), "mu": np.array([-1.0, 1.0]), "var": np.array([1.0, 1.0])}
