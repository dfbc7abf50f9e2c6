"""Start-up and per-iteration cost of each EM engine backend, measured side by side.

For every backend the script times (1) start-up: ``encoded_data(...)`` from raw rows, which starts
the engine when the backend owns it (dask LocalCluster, local Ray, SparkContext ``local[n]``),
encodes the chunks and places them on the workers; (2) one EM data pass (``handle.estep``), the
median of ``--iters`` passes; (3) ``close()``. The ``mpi`` row runs this script under
``mpiexec -n WORKERS`` (rank 0 reports; the mpiexec launch itself is reported separately).
Every backend must reach the same model digest; the table says so in its last column.

    python benchmarks/em_engine_overhead.py --rows 200000 --components 4 --workers 2 --iters 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ALL_BACKENDS = ("local", "mp", "mpi", "spark", "dask", "ray")


def make_data(rows: int, components: int) -> np.ndarray:
    """Rows from a 1-D Gaussian mixture with well separated means."""
    rng = np.random.default_rng(0)
    means = np.linspace(-3.0 * components, 3.0 * components, components)
    return rng.normal(means[rng.integers(0, components, rows)], 1.0)


def measure(backend: str, workers: int, args: argparse.Namespace, comm: Any = None) -> dict[str, Any]:
    """Start-up, per-pass and close times of one backend (called on every rank for mpi)."""
    from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, encoded_data
    from mixle_parallel.executors.estimation.models._base import model_digest

    data = make_data(args.rows, args.components)
    est = MixtureEstimator([GaussianEstimator() for _ in range(args.components)])
    extra: dict[str, Any] = {"comm": comm} if backend == "mpi" else {}
    if backend == "ray":
        extra["init_kwargs"] = {"num_cpus": workers, "include_dashboard": False, "log_to_driver": False}
    t0 = time.perf_counter()
    # admission="unverified" and audit=False: this measures the bare engine; the audit's cost is
    # measured side by side in benchmarks/em_audit_overhead.py
    handle = encoded_data(data, estimator=est, backend=backend, num_workers=workers,
                          chunk_size=args.chunk_size, admission="unverified", audit=False, **extra)
    startup = time.perf_counter() - t0
    try:
        model = handle.pysp_seq_initialize(est, 1, 0.1)
        passes = []
        for _ in range(args.iters):
            t = time.perf_counter()
            model = handle.estep(est, model).model
            passes.append(time.perf_counter() - t)
    finally:
        t = time.perf_counter()
        handle.close()
        close = time.perf_counter() - t
    return {"backend": backend, "workers": workers, "startup_s": startup, "pass_s": statistics.median(passes),
            "close_s": close, "digest": model_digest(model)}


def run_mpi(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run the mpi measurement under mpiexec; rank 0's numbers plus the launch wall time."""
    import importlib.util

    spec = importlib.util.find_spec("mpi4py")
    exe = Path(sys.executable).parent / "mpiexec"
    if not exe.exists() and spec is not None and spec.origin:
        exe = Path(spec.origin).resolve().parents[4] / "bin" / "mpiexec"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(exe.resolve().parent.parent / "lib") + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    cmd = [str(exe), "-n", str(workers), sys.executable, __file__, "--mpi-child", "--rows", str(args.rows),
           "--components", str(args.components), "--iters", str(args.iters), "--chunk-size", str(args.chunk_size)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"mpiexec failed:\n{proc.stderr[-3000:]}")
    row = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    row["launch_wall_s"] = wall
    return row


def main(argv: list[str] | None = None) -> int:
    """Print the table (and JSON lines with --json)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--components", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--chunk-size", type=int, default=16384)
    p.add_argument("--backends", default=",".join(ALL_BACKENDS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--mpi-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mpi_child:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        row = measure("mpi", comm.Get_size(), args, comm)
        if comm.Get_rank() == 0:
            print(json.dumps(row), flush=True)
        return 0
    rows = [measure("local", 1, args)]
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        rows.append(run_mpi(args.workers, args) if backend == "mpi" else measure(backend, args.workers, args))
    base = rows[0]
    print(f"{args.rows} rows, 1-D, K={args.components}, chunk_size={args.chunk_size}, "
          f"{args.iters} passes (median), CPUs available: {len(os.sched_getaffinity(0))}")
    print(
        f"{'backend':8} {'workers':>7} {'start-up s':>10} {'pass s':>8} {'pass / local-1':>14} {'close s':>8}  same "
        "bits"
    )
    for r in rows:
        note = f"  (+ mpiexec launch, total wall {r['launch_wall_s']:.2f} s)" if "launch_wall_s" in r else ""
        print(
            f"{r['backend']:8} {r['workers']:>7} {r['startup_s']:>10.3f} {r['pass_s']:>8.4f} "
            f"{r['pass_s'] / base['pass_s']:>14.2f} {r['close_s']:>8.3f}  {r['digest'] == base['digest']}{note}"
        )
        if args.json:
            print(json.dumps(r))
    return 0 if all(r["digest"] == base["digest"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
