"""Seconds per EM pass on ``mpi`` / ``torchrun``: what the collective-schedule check costs, run before and after.

Run on every rank, from the checkout to measure (``PYTHONPATH`` at it): ``mpiexec -n 2 python -m
benchmarks.spmd_schedule_cost mpi`` or ``torchrun --standalone --nproc-per-node 2 -m benchmarks.spmd_schedule_cost
torchrun``. Unaudited E-steps and log-density passes alternate on one handle (audit off: only the passes and their
collectives are timed), each preceded by an all-gather that lines the ranks up; the root prints the median
seconds per pass of each kind. Compare a checkout without the check (e.g. the commit before it) with one that has
it, alternating runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("backend", choices=["mpi", "torchrun"])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--chunks", type=int, default=24)
    parser.add_argument("--passes", type=int, default=60)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    data = np.concatenate([rng.normal(-4, 1.0, args.rows // 2), rng.normal(3, 1.5, args.rows - args.rows // 2)])
    est = MixtureEstimator([GaussianEstimator()] * 3)
    extra = {"backend_name": "gloo"} if args.backend == "torchrun" else {}
    with encoded_data(data, estimator=est, backend=args.backend, num_chunks=args.chunks, audit=False,
                      admission="unverified", **extra) as handle:
        runner = handle.runner
        model = handle.pysp_seq_initialize(est, np.random.RandomState(1), 0.5)
        passes: dict[str, Any] = {"estep": lambda: handle.estep(est, model),
                                  "log-density": lambda: handle.pysp_seq_log_density_sum(model)}
        times: dict[str, list[float]] = {k: [] for k in passes}
        for _ in range(args.passes):
            for kind, run in passes.items():
                runner.all_gather(None)  # line the ranks up
                t0 = time.perf_counter()
                run()
                times[kind].append(time.perf_counter() - t0)
        if runner.is_root:
            each = ", ".join(f"{k} {statistics.median(v) * 1e3:.3f} ms" for k, v in times.items())
            print(f"{args.backend} ranks={runner.size} rows={args.rows} chunks={args.chunks}: median pass {each}")


if __name__ == "__main__":
    main()
