"""EM from Parquet files on spark local[2], dask and ray: the driver's peak RSS and the time per pass by size.

    python benchmarks/em_scale.py [--rows 1000000,10000000,50000000] [--engines spark,dask,ray]
        [--iters 4] [--dir DIR] [--workers 2]

For every size the rows (4-D, two clusters) are written once as Parquet files of at most 1,000,000 rows
(row groups of 250,000) under DIR (default: a temporary folder, removed at the end). Each (engine, size)
fit runs in a fresh driver process started by this script: it starts the engine (a local[2] SparkContext,
a dask LocalCluster of 2 worker processes, a local Ray of 2 CPUs), notes its RSS, then fits
``files(DIR/<size>/*.parquet)`` with a 4-component diagonal Gaussian mixture (k-means++ start, ``--iters``
passes) and reports its peak RSS (``VmHWM``: the driver alone, never the workers or the JVM), the
open time (start + reading every chunk on the workers + initialization) and the seconds per EM pass.
The issue's bound: the 50M driver peak within 1.2x of the 1M one, for every engine (column "peak/first").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROWS_PER_FILE = 1_000_000
ROW_GROUP = 250_000


def write_rows(folder: str, rows: int, seed: int = 0) -> None:
    """``rows`` 4-D rows in Parquet files of at most ROWS_PER_FILE rows under ``folder``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, first in enumerate(range(0, rows, ROWS_PER_FILE)):
        n = min(ROWS_PER_FILE, rows - first)
        x = rng.normal(size=(n, 4)) + rng.choice([-3.0, 0.0, 3.0], size=(n, 1))
        table = pa.table({f"x{j}": x[:, j] for j in range(4)})
        pq.write_table(table, os.path.join(folder, f"part-{i:05d}.parquet"), row_group_size=ROW_GROUP)


def _rss_mb(field: str = "VmRSS") -> float:
    """This process's ``VmRSS`` (now) or ``VmHWM`` (its peak since it started: unlike ``ru_maxrss``, not
    carried over from the process that started it) in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _engine(engine: str, workers: int) -> tuple[dict, object]:
    """The fit's engine keywords and a closer."""
    if engine == "spark":
        import pyspark

        conf = (pyspark.SparkConf().setMaster(f"local[{workers}]").setAppName("em-scale")
                .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
                .set("spark.driver.bindAddress", "127.0.0.1").set("spark.pyspark.python", sys.executable))
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        sc = pyspark.SparkContext(conf=conf)
        sc.setLogLevel("ERROR")
        return {"client": sc}, sc.stop
    if engine == "dask":
        import logging

        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                               silence_logs=logging.ERROR)
        client = Client(cluster)

        def close() -> None:
            client.close()
            cluster.close()

        return {"client": client}, close
    import ray

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    return {}, ray.shutdown


def one_fit(engine: str, folder: str, iters: int, workers: int) -> dict:
    """Run in the measured driver: start the engine, fit the files, report RSS and times."""
    from mixle_parallel import DiagonalGaussianEstimator, MixtureEstimator, files, fit

    keywords, close = _engine(engine, workers)
    try:
        before = _rss_mb()
        passes: list[float] = []
        t0 = time.perf_counter()
        estimator = MixtureEstimator([DiagonalGaussianEstimator(dim=4) for _ in range(4)])
        result = fit(files(os.path.join(folder, "*.parquet")), estimator, backend=engine, num_workers=workers,
                     max_its=iters, delta=None, seed=1, progress=False, admission="unverified",
                     on_step=lambda step: passes.append(time.perf_counter()), **keywords)
        total = time.perf_counter() - t0
    finally:
        close()  # type: ignore[operator]
    steps = [b - a for a, b in zip(passes, passes[1:])]
    return {"engine": engine, "rss_before_mb": before, "peak_mb": _rss_mb("VmHWM"),
            "open_s": total - sum(steps), "pass_s": (sum(steps) / len(steps)) if steps else float("nan"),
            "ll": float(result.history[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,10000000,50000000")
    parser.add_argument("--engines", default="spark,dask,ray")
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # ENGINE FOLDER: the measured driver
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_fit(args.one[0], args.one[1], args.iters, args.workers)), flush=True)
        return
    root = args.dir or tempfile.mkdtemp(prefix="em-scale-")
    sizes = [int(float(s)) for s in args.rows.split(",")]
    rows: list[dict] = []
    try:
        for size in sizes:
            folder = os.path.join(root, str(size))
            if not os.path.isdir(folder):
                write_rows(folder, size)
            for engine in args.engines.split(","):
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", engine, folder, "--iters",
                                       str(args.iters), "--workers", str(args.workers)],
                                      capture_output=True, text=True)
                line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if done.returncode != 0 or not line:
                    print(f"{engine} {size}: failed\n{done.stderr[-2000:]}", flush=True)
                    continue
                rows.append({"rows": size, **json.loads(line[0][7:])})
                print(f"done: {engine} {size:,} rows", flush=True)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    first = {r["engine"]: r["peak_mb"] for r in rows if r["rows"] == sizes[0]}
    print(f"\n{'engine':<7}{'rows':>12}{'RSS before':>12}{'peak RSS':>10}{'peak/first':>11}{'open s':>9}"
          f"{'s/pass':>9}  log-likelihood")
    for r in rows:
        ratio = r["peak_mb"] / first[r["engine"]] if r["engine"] in first else float("nan")
        print(f"{r['engine']:<7}{r['rows']:>12,}{r['rss_before_mb']:>10.0f}MB{r['peak_mb']:>8.0f}MB{ratio:>11.2f}"
              f"{r['open_s']:>9.1f}{r['pass_s']:>9.2f}  {r['ll']:.6g}")
    print("\n(driver = this script's child per fit; RSS in MB; the workers' and the JVM's memory are not the driver's)")


if __name__ == "__main__":
    main()
