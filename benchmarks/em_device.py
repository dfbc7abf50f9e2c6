"""EM on a GPU: the torch kernel on CUDA (fp32, fp64) against the numpy kernel on the CPU and scikit-learn.

    python benchmarks/em_device.py [--rows 10000000] [--dims 8] [--k 8] [--budget-s 60] [--json PATH]

The same rows for every library: ``rows`` x ``dims`` drawn from ``k`` well-separated unit-variance
Gaussians (seeded), fitted as a K-component diagonal-covariance mixture. Each library stops by the
same rule, the change of the mean log-likelihood per row below 1e-6 (scikit-learn's ``tol=1e-6``;
ours ``delta=1e-6 * rows``), and each has a wall-clock budget: a fit still running when its budget is
spent stops there and its row says so (``converged`` no). Printed per library: the wall time from
rows to fitted model (initialization included), iterations, whether it converged, the mean
log-likelihood per row of the fitted model scored on the CPU by our numpy kernel (the same scorer
for all), and the time ratio to the numpy kernel. A row whose kernel needs CUDA on a machine without
it reads ``not run (no device)``. ``--json`` also writes the rows as JSON (``scripts/device-check``
reads it). Ours runs with ``audit=False`` and ``admission="unverified"``: this measures the kernel,
not the audit (``benchmarks/em_audit_overhead.py`` measures that).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from mixle_parallel.executors.estimation import (
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    fit,
)

TOL_PER_ROW = 1e-6
MAX_ITS = 2000


class BudgetSpent(Exception):
    """Raised from a fit's per-pass callback when its wall-clock budget is spent."""


class Row(NamedTuple):
    """One library's fit: what the table and the JSON report."""

    library: str
    status: str
    """'ok', 'budget' (stopped when the budget was spent) or 'not run (...)'."""
    wall_s: float
    iterations: int
    converged: bool
    mean_ll: float


def make_rows(rows: int, dims: int, k: int, seed: int) -> np.ndarray:
    """``rows`` x ``dims`` from ``k`` unit-variance Gaussians with centers drawn at scale 4, shuffled."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 4.0, (k, dims))
    counts = [rows // k + (i < rows % k) for i in range(k)]
    x = np.concatenate([rng.normal(c, 1.0, (n, dims)) for c, n in zip(centers, counts)])
    return x[rng.permutation(rows)]


def mean_ll(model: MixtureDistribution, x: np.ndarray) -> float:
    """Mean log-likelihood per row of ``model`` on ``x`` (our numpy kernel, in slices to bound memory)."""
    step = 1_000_000
    return float(sum(np.sum(model.log_density(x[i:i + step])) for i in range(0, len(x), step)) / len(x))


def cuda_available() -> bool:
    """Whether torch is importable and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run_ours(x: np.ndarray, k: int, seed: int, budget_s: float, engine: str | None, precision: str | None) -> Row:
    """Our ``fit`` with the given compute kernel, stopped when ``budget_s`` is spent."""
    est = MixtureEstimator([DiagonalGaussianEstimator(x.shape[1]) for _ in range(k)])
    label = "numpy (cpu)" if engine is None else f"{engine} {precision}"
    steps: list[tuple[int, float, Any]] = []
    t0 = time.perf_counter()

    def guard(step: Any) -> None:
        steps.append((step.iteration, step.log_likelihood, step.model))
        if time.perf_counter() - t0 > budget_s:
            raise BudgetSpent

    try:
        result = fit(x, est, max_its=MAX_ITS, delta=TOL_PER_ROW * len(x), seed=seed, engine=engine,
                     precision=precision, audit=False, admission="unverified", progress=False, on_step=guard)
    except BudgetSpent:
        wall = time.perf_counter() - t0
        return Row(label, "budget", wall, len(steps), False, mean_ll(steps[-1][2], x))
    wall = time.perf_counter() - t0
    return Row(label, "ok", wall, result.iterations, result.converged, mean_ll(result.model, x))


def run_sklearn(x: np.ndarray, k: int, seed: int, budget_s: float) -> Row:
    """scikit-learn's GaussianMixture (diag), one EM step per warm-started call so the budget can stop it."""
    from sklearn.mixture import GaussianMixture

    gm = GaussianMixture(k, covariance_type="diag", tol=TOL_PER_ROW, max_iter=1, warm_start=True, random_state=seed)
    t0 = time.perf_counter()
    previous, iterations, converged = -np.inf, 0, False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each one-step call warns that it did not converge
        while iterations < MAX_ITS:
            gm.fit(x)
            iterations += 1
            if abs(gm.lower_bound_ - previous) < TOL_PER_ROW:
                converged = True
                break
            previous = gm.lower_bound_
            if time.perf_counter() - t0 > budget_s:
                break
    wall = time.perf_counter() - t0
    comps = [DiagonalGaussianDistribution(np.asarray(m), np.asarray(v)) for m, v in zip(gm.means_, gm.covariances_)]
    model = MixtureDistribution(comps, gm.weights_)
    return Row("scikit-learn (cpu)", "ok" if converged else "budget", wall, iterations, converged, mean_ll(model, x))


LIBRARIES: dict[str, tuple[bool, Callable[[np.ndarray, int, int, float], Row]]] = {
    "torch-cuda-fp32": (True, lambda x, k, s, b: run_ours(x, k, s, b, "torch:cuda", "fp32")),
    "torch-cuda-fp64": (True, lambda x, k, s, b: run_ours(x, k, s, b, "torch:cuda", "fp64")),
    "torch-cpu-fp64": (False, lambda x, k, s, b: run_ours(x, k, s, b, "torch:cpu", "fp64")),
    "numpy": (False, lambda x, k, s, b: run_ours(x, k, s, b, None, None)),
    "sklearn": (False, run_sklearn),
}
"""Library name -> (needs CUDA, runner). ``torch-cpu-fp64`` is for a dry run of this script without a GPU."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dims", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=60.0, help="wall-clock budget of each library's fit")
    parser.add_argument("--libraries", default="torch-cuda-fp32,torch-cuda-fp64,numpy,sklearn",
                        help=f"comma-separated, of {', '.join(LIBRARIES)}")
    parser.add_argument("--json", default=None, help="also write the rows here as JSON")
    args = parser.parse_args(argv)
    names = [n for n in args.libraries.split(",") if n]
    unknown = [n for n in names if n not in LIBRARIES]
    if unknown:
        parser.error(f"unknown --libraries {unknown}: choose from {', '.join(LIBRARIES)}")
    if args.rows < 100 * args.k:
        parser.error(f"--rows {args.rows} is too few for --k {args.k}: give at least {100 * args.k}")
    has_cuda = cuda_available()
    x = make_rows(args.rows, args.dims, args.k, args.seed)
    for name in names:  # warm-up off the clock: imports, CUDA context, first-call set-up
        needs_cuda, runner = LIBRARIES[name]
        if has_cuda or not needs_cuda:
            runner(x[:2000], args.k, args.seed, args.budget_s)
    rows = []
    for name in names:
        needs_cuda, runner = LIBRARIES[name]
        if needs_cuda and not has_cuda:
            rows.append(Row(name, "not run (no device)", float("nan"), 0, False, float("nan")))
            continue
        rows.append(runner(x, args.k, args.seed, args.budget_s))
    base = next((r.wall_s for r in rows if r.library == "numpy (cpu)"), float("nan"))
    label = f"{args.rows:,} x {args.dims}-D diag K={args.k}"
    header = (f"{'data':<28} {'library':<20} {'status':<20} {'wall s':>8} {'iters':>6} {'conv':>5} "
              f"{'mean ll/row':>13} {'x numpy':>8}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{label:<28} {r.library:<20} {r.status:<20} {r.wall_s:>8.2f} {r.iterations:>6} "
              f"{'yes' if r.converged else 'no':>5} {r.mean_ll:>13.6f} {r.wall_s / base:>8.3f}")
    if args.json:
        doc = {"rows": args.rows, "dims": args.dims, "k": args.k, "cuda": has_cuda, "budget_s": args.budget_s,
               "results": [r._asdict() for r in rows]}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
