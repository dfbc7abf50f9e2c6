"""E-step kernels of the built-in models on torch tensors: stacked log densities and statistics.

For a model -- one of the kinds of ``engine_choice.TORCH_KERNEL_MODELS`` or a mixture of them --
:func:`estep` returns the per-row log density and the statistics in exactly the form the numpy
accumulator's ``value()`` has (float64 numpy), so combining, the M-step, digests and audits are
unchanged. Parameters are prepared on the host in float64 (as the numpy models hold them) and
cast once to the compute dtype; data comes in as :class:`ChunkTensors` (``torch_engine.chunk_tensors``).
Reductions are sums and matrix products over the rows of one chunk; categorical counts use
``index_put_(accumulate=True)``, deterministic on CUDA (sort-based) and on one CPU thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ..em_pass.engine_choice import kernel_kind
from ..models import MixtureDistribution

__all__ = ["ChunkTensors", "estep", "log_density", "stacked_log_density", "stacked_statistics"]


class ChunkTensors(NamedTuple):
    """A chunk's encoded data as tensors (``data``: x; x[n, d]; (x, log x!); (uniques, indices)),
    its row count, and the compute dtype and device."""

    data: Any
    rows: int
    dtype: torch.dtype
    device: torch.device


def _vec(values: Sequence[float] | np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """Host float64 parameters as a tensor of ``like``'s dtype and device."""
    return torch.as_tensor(np.asarray(values, dtype=np.float64), device=like.device).to(like.dtype)


def _params(values: Any, chunk: ChunkTensors) -> torch.Tensor:
    """Host float64 parameters as a tensor of the chunk's compute dtype and device."""
    return torch.as_tensor(np.asarray(values, dtype=np.float64), device=chunk.device).to(chunk.dtype)


# ---- log densities: (K, n) for K components of one kind ---------------------------------------------
def _gaussian_ld(comps: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
    mu, h, c = _vec([m.mu for m in comps], x), _vec([m._h for m in comps], x), _vec([m._c for m in comps], x)
    d = x.unsqueeze(0) - mu.unsqueeze(1)
    d.square_()
    d.mul_(h.unsqueeze(1))
    return d.add_(c.unsqueeze(1))


BLOCK_ELEMENTS = 1 << 22
"""Most elements of a (components, rows, d) temporary: components are taken in blocks that fit."""


def _component_blocks(k: int, x: torch.Tensor) -> list[slice]:
    """Slices of ``range(k)`` whose (block, n, d) temporaries stay under :data:`BLOCK_ELEMENTS`."""
    per = max(1, BLOCK_ELEMENTS // max(1, x.shape[0] * x.shape[1]))
    return [slice(a, min(k, a + per)) for a in range(0, k, per)]


def _centered(x: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """(block, n, d) rows minus each component's mean: the direct form (no cancellation in fp32)."""
    return x.unsqueeze(0) - mu.unsqueeze(1)


def _diagonal_ld(comps: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
    """sum_j (x_j - mu_j)^2 prec_j per component and row, then the constants.

    fp64: expanded into two matrix products (no (K, n, d) temporary) around the components' mean
    point ``c``, which keeps the cancellation at the numpy engine's own level (its stacked kernel
    expands around 0). fp32: the direct form, batched over blocks of components, because the
    expansion would cancel ~10x more of fp32's 24 bits."""
    mu, prec = _vec(np.stack([m.mu for m in comps]), x), _vec(np.stack([m._prec for m in comps]), x)
    const = _vec([float(m._c) for m in comps], x).unsqueeze(1)
    if x.dtype == torch.float64:
        c = mu.mean(dim=0)
        xc, muc = x - c, mu - c
        quad = prec @ (xc * xc).T  # (K, n)
        quad.addmm_(muc * prec, xc.T, alpha=-2.0)
        quad.add_((muc * muc * prec).sum(dim=1, keepdim=True))
    else:
        quad = torch.cat([torch.bmm(_centered(x, mu[b]).square_(), prec[b].unsqueeze(2)).squeeze(2)
                          for b in _component_blocks(len(comps), x)])
    return quad.mul_(-0.5).add_(const)


def _full_ld(comps: Sequence[Any], x: torch.Tensor) -> torch.Tensor:
    mu, inv_chol_t = _vec(np.stack([m.mu for m in comps]), x), _vec(np.stack([m._inv_chol_t for m in comps]), x)
    const = _vec([float(m._c) for m in comps], x).unsqueeze(1)
    parts = []
    for b in _component_blocks(len(comps), x):  # Mahalanobis distance through the inverse Cholesky factor
        z = torch.bmm(_centered(x, mu[b]), inv_chol_t[b])
        parts.append(z.square_().sum(dim=2))
    return torch.cat(parts).mul_(-0.5).add_(const)


def _poisson_ld(comps: Sequence[Any], enc: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, lgx = enc
    rows = []
    for m in comps:
        if m.lam == 0.0:
            rows.append(torch.where(x == 0.0, torch.zeros_like(x), torch.full_like(x, -math.inf)))
        else:
            rows.append(x * math.log(m.lam) - m.lam - lgx)
    return torch.stack(rows)


def _categorical_ld(comps: Sequence[Any], enc: tuple[tuple[Any, ...], torch.Tensor],
                    chunk: ChunkTensors) -> torch.Tensor:
    uniques, inv = enc
    if not uniques:
        return torch.zeros((len(comps), len(inv)), dtype=chunk.dtype, device=chunk.device)
    table = np.array([[m._log.get(u, m._log_default) for u in uniques] for m in comps], dtype=np.float64)
    return _params(table, chunk)[:, inv]


_LOG_DENSITY: dict[str, Callable[[Sequence[Any], Any], torch.Tensor]] = {
    "gaussian": _gaussian_ld, "diagonal": _diagonal_ld, "full": _full_ld, "poisson": _poisson_ld,
}


def stacked_log_density(kind: str, comps: Sequence[Any], chunk: ChunkTensors) -> torch.Tensor:
    """(K, n) log densities of ``comps`` (all of ``kind``) on a chunk's tensors."""
    if kind == "categorical":
        return _categorical_ld(comps, chunk.data, chunk)
    return _LOG_DENSITY[kind](comps, chunk.data)


# ---- statistics: K values in the numpy accumulators' ``value()`` form ----------------------------------
def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def _weight_sums(resp: torch.Tensor) -> np.ndarray:
    return _host(resp.sum(dim=1))


def _gaussian_stats(resp: torch.Tensor, x: torch.Tensor) -> list[Any]:
    sums = _host(resp @ torch.stack([x, x * x], dim=1))
    sw = _weight_sums(resp)
    return [(float(sw[k]), float(sums[k, 0]), float(sums[k, 1])) for k in range(len(sw))]


def _diagonal_stats(resp: torch.Tensor, x: torch.Tensor) -> list[Any]:
    d = x.shape[1]
    sums = _host(resp @ torch.cat([x, x * x], dim=1))
    sw = _weight_sums(resp)
    return [(float(sw[k]), sums[k, :d].copy(), sums[k, d:].copy()) for k in range(len(sw))]


def _full_stats(resp: torch.Tensor, x: torch.Tensor) -> list[Any]:
    sw, sx = _weight_sums(resp), _host(resp @ x)
    out = []
    for k in range(len(sw)):
        sxx = (x * resp[k].unsqueeze(1)).T @ x
        out.append((float(sw[k]), sx[k].copy(), _host(sxx)))
    return out


def _poisson_stats(resp: torch.Tensor, enc: tuple[torch.Tensor, torch.Tensor]) -> list[Any]:
    sw, sx = _weight_sums(resp), _host(resp @ enc[0])
    return [(float(sw[k]), float(sx[k])) for k in range(len(sw))]


def _categorical_stats(resp: torch.Tensor, enc: tuple[tuple[Any, ...], torch.Tensor]) -> list[Any]:
    uniques, inv = enc
    counts = torch.zeros((len(uniques), resp.shape[0]), dtype=resp.dtype, device=resp.device)
    counts.index_put_((inv,), resp.T.contiguous(), accumulate=True)  # deterministic: sorted on CUDA, one thread on CPU
    table = _host(counts)
    return [{u: float(table[j, k]) for j, u in enumerate(uniques)} for k in range(resp.shape[0])]


_STATISTICS: dict[str, Callable[[torch.Tensor, Any], list[Any]]] = {
    "gaussian": _gaussian_stats, "diagonal": _diagonal_stats, "full": _full_stats,
    "poisson": _poisson_stats, "categorical": _categorical_stats,
}


def stacked_statistics(kind: str, resp: torch.Tensor, chunk: ChunkTensors) -> list[Any]:
    """Per-component statistics of ``kind`` under (K, n) responsibilities (row weights for K = 1)."""
    return _STATISTICS[kind](resp, chunk.data)


# ---- models ---------------------------------------------------------------------------------------------
def _groups(comps: Sequence[Any]) -> dict[str, list[int]]:
    """Component indices by kernel kind, in component order."""
    out: dict[str, list[int]] = {}
    for i, c in enumerate(comps):
        kind = kernel_kind(c)
        if kind is None:
            raise TypeError(f"the torch EM engine has no kernel for {type(c).__name__}; use engine='numpy'")
        out.setdefault(kind, []).append(i)
    return out


def _component_log_densities(comps: Sequence[Any], chunk: ChunkTensors) -> tuple[dict[str, list[int]], torch.Tensor]:
    """The kinds' groups and the (K, n) log densities of every component, each group computed stacked."""
    groups = _groups(comps)
    if len(groups) == 1:
        (kind, ids), = groups.items()
        return groups, stacked_log_density(kind, [comps[i] for i in ids], chunk)
    out = torch.empty((len(comps), chunk.rows), dtype=chunk.dtype, device=chunk.device)
    for kind, ids in groups.items():
        out[ids] = stacked_log_density(kind, [comps[i] for i in ids], chunk)
    return groups, out


def _posterior(ll: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable log-sum-exp over components, in place on ``ll``: (per-row log density, responsibilities).

    Rows where every component has -inf get log density -inf and zero responsibilities."""
    m = ll.amax(dim=0)
    finite = torch.isfinite(m)
    if bool(finite.all()):  # the common case: every row has a component it can come from (sum >= 1)
        e = ll.sub_(m).exp_()
        s = e.sum(dim=0)
        return s.log().add_(m), e.div_(s)
    m = torch.where(finite, m, torch.zeros_like(m))
    e = ll.sub_(m).exp_()
    s = e.sum(dim=0)
    alive = s > 0
    safe = torch.where(alive, s, torch.ones_like(s))
    lse = torch.where(alive, torch.log(safe) + m, torch.full_like(s, -math.inf))
    return lse, e.div_(safe)


def _mixture_log_densities(model: MixtureDistribution,
                           chunk: ChunkTensors) -> tuple[dict[str, list[int]], torch.Tensor]:
    groups, ll = _component_log_densities(model.components, chunk)
    return groups, ll.add_(_params(model.log_weights, chunk).unsqueeze(1))


def log_density(model: Any, chunk: ChunkTensors) -> np.ndarray:
    """Per-row log density (float64 numpy) of ``model``, a kernel kind or a mixture of them."""
    if type(model) is MixtureDistribution:
        return _host(_posterior(_mixture_log_densities(model, chunk)[1])[0])
    return _host(_component_log_densities((model,), chunk)[1][0])


def estep(model: Any, chunk: ChunkTensors, weights: torch.Tensor | None) -> tuple[np.ndarray, Any]:
    """(per-row log density as float64 numpy, statistics in the numpy accumulator's form) of one chunk."""
    if type(model) is not MixtureDistribution:
        groups, ld = _component_log_densities((model,), chunk)
        resp = (torch.ones((1, chunk.rows), dtype=chunk.dtype, device=chunk.device) if weights is None
                else weights.to(chunk.dtype).unsqueeze(0))
        return _host(ld[0]), stacked_statistics(next(iter(groups)), resp, chunk)[0]
    groups, ll = _mixture_log_densities(model, chunk)
    lse, resp = _posterior(ll)
    if weights is not None:
        resp.mul_(weights.to(resp.dtype).unsqueeze(0))
    stats: list[Any] = [None] * len(model.components)
    for kind, ids in groups.items():
        for i, value in zip(ids, stacked_statistics(kind, resp[ids], chunk)):
            stats[i] = value
    return _host(lse), (_weight_sums(resp), tuple(stats))
