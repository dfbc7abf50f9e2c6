"""Full-covariance EM on Spark: MLlib's ``GaussianMixture`` and ``backend="spark"``, side by side in one run.

    python benchmarks/em_vs_mllib.py [--rows 200000] [--dim 4] [--k 6] [--master local[2]] [--seed 0]
    python benchmarks/em_vs_mllib.py --source parquet --rows 1000000 --k 3   # issue 33's Spark-user case

One SparkContext (``--master``, default ``local[2]``) and one data set (``--rows`` x ``--dim``, ``--k``
Gaussians with random full covariances, the generator of ``em_time_to_solution.py``'s ``4df6`` case)
for both. MLlib fits a cached DataFrame of vectors (made and counted off the clock); ours fits the
same rows on the same context (``fit(x, ..., backend="spark", client=sc)``: encoding, placing the
chunks in Spark and initialization are on the clock). The stopping rule is the same for both: the
total log-likelihood gains less than ``1e-6`` x rows (MLlib ``tol``, our ``delta``), with a generous
iteration cap. Ours runs twice: the first call also certifies this machine's mesh once (the admission
gate; counted), the second is the steady state. Printed per row: wall time to a converged fit,
iterations, the time of one pass (ours: the median of the fit's own ``estep`` calls, a batch's judging counted
with the start; MLlib: its fit's wall time
less a ``maxIter=1`` fit's, over the iterations but one), the rest (start), the mean log-likelihood per
row (every model scored on the same rows by our kernel) and the ratio to MLlib's wall time.
Target (issue 25): ours <= 0.2x MLlib's time, log-likelihood within 1e-3 per row of the best.

``--source parquet`` is a Spark user's default path (issue 33): the rows are written once as a Parquet table
(one double column per dimension) and every fit reads that table as a DataFrame, on the clock: MLlib through a
``VectorAssembler``, ours as ``fit(df, est, backend="spark", client=sc)`` with its defaults (the production
audit on), again with ``audit=False``, and with ``direct_channel=False`` (a Spark job per pass instead of the
passes served by tasks kept alive, ``backends.spark_channel``). Each is run once to warm up and then measured;
MLlib's pass time is not split out there (``ms/pass`` is its wall time over its iterations). The measured fits are
``--repeats`` rounds of the four cases, interleaved; each row is the case's median fit (every wall is printed with
the ratio).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from em_time_to_solution import Fitted, full_covariance_rows, score  # noqa: E402

from mixle_parallel.executors.estimation import (  # noqa: E402
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    encoded_data,
    fit,
)

TOL_PER_ROW = 1e-6
MAX_ITS = 2000


def spark_session(master: str) -> Any:
    """A SparkSession on ``master`` (its context serves both libraries)."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("em-vs-mllib")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "4g")
             .config("spark.pyspark.python", sys.executable).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def vectors_frame(spark: Any, x: np.ndarray, partitions: int) -> Any:
    """A cached DataFrame with one vector column ``features`` holding the rows of ``x`` (counted: in place)."""
    from pyspark.ml.feature import VectorAssembler

    cols = [f"x{j}" for j in range(x.shape[1])]
    frame = spark.createDataFrame(x.tolist(), schema=cols)
    assembled = VectorAssembler(inputCols=cols, outputCol="features").transform(frame).select("features")
    assembled = assembled.repartition(partitions).cache()
    assembled.count()
    return assembled


def run_mllib(frame: Any, rows: int, k: int, seed: int, max_iter: int = MAX_ITS) -> tuple[float, Fitted]:
    """MLlib's fit: wall seconds and the model (as ours, to score it) with its iterations."""
    from pyspark.ml.clustering import GaussianMixture

    gm = GaussianMixture(k=k, tol=TOL_PER_ROW * rows, maxIter=max_iter, seed=seed)
    t0 = time.perf_counter()
    model = gm.fit(frame)
    wall = time.perf_counter() - t0
    gaussians = model.gaussiansDF.collect()
    comps = [MultivariateGaussianDistribution(np.asarray(g["mean"].toArray()), np.asarray(g["cov"].toArray()))
             for g in gaussians]
    mixture = MixtureDistribution(comps, np.asarray(model.weights))
    return wall, Fitted(mixture, int(model.summary.numIter), float("nan"))


def run_ours(sc: Any, x: Any, k: int, seed: int, *, rows: int = 0, dim: int = 0,
             **options: Any) -> tuple[float, Fitted]:
    """Our fit on the same SparkContext (of ``x``: an array or a DataFrame of ``rows`` x ``dim``): wall seconds,
    the model, iterations and the median pass. As a user calls it (no ``on_step``, which would have every pass
    judged before the call): the pass time is the handle's ``estep`` as the fit ran it, so a batch of passes judged
    together (``deferred_judging``) counts in the rest, with the start."""
    rows, dim = (rows, dim) if rows else x.shape
    est = MixtureEstimator([MultivariateGaussianEstimator(dim) for _ in range(k)])
    passes: list[float] = []
    t0 = time.perf_counter()
    with encoded_data(x, estimator=est, backend="spark", client=sc, **options) as handle:
        estep = handle.estep

        def timed(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return estep(*args)
            finally:
                passes.append(time.perf_counter() - t)

        handle.estep = timed  # type: ignore[method-assign]  # the fit's own passes, timed
        result = fit(handle, est, max_its=MAX_ITS, delta=TOL_PER_ROW * rows, seed=seed, progress=False)
    wall = time.perf_counter() - t0
    return wall, Fitted(result.model, result.iterations, statistics.median(passes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=4)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", choices=("memory", "parquet"), default="memory")
    parser.add_argument("--repeats", type=int, default=3, help="measured fits per case (parquet), interleaved; "
                        "the median is shown")
    args = parser.parse_args()
    x = full_covariance_rows(np.random.default_rng(args.seed), args.rows, args.k, args.dim)
    spark = spark_session(args.master)
    if args.source == "parquet":
        try:
            parquet_rows(spark, x, args)
        finally:
            spark.stop()
        return
    try:
        sc = spark.sparkContext
        frame = vectors_frame(spark, x, sc.defaultParallelism)
        run_mllib(frame, args.rows, args.k, args.seed, max_iter=2)  # warm-up: JIT, MLlib's first-call set-up
        print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
        rows = {"MLlib GaussianMixture": run_mllib(frame, args.rows, args.k, args.seed)}
        one_pass, _ = run_mllib(frame, args.rows, args.k, args.seed, max_iter=1)
        wall, mllib = rows["MLlib GaussianMixture"]
        per = (wall - one_pass) / max(mllib.iterations - 1, 1)
        rows["MLlib GaussianMixture"] = (wall, mllib._replace(pass_s=per))
        rows["ours spark (1st call)"] = run_ours(sc, x, args.k, args.seed)
        rows["ours spark"] = run_ours(sc, x, args.k, args.seed)
        print_rows(f"{args.rows:,} x {args.dim}-D full K={args.k} {args.master}", x, rows)
        print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    finally:
        spark.stop()


def write_parquet(x: np.ndarray, folder: str) -> str:
    """``x`` as one Parquet file of double columns ``x0..x{d-1}`` under ``folder``; its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(folder, "rows.parquet")
    pq.write_table(pa.table({f"x{j}": x[:, j] for j in range(x.shape[1])}), path)
    return path


def run_mllib_parquet(spark: Any, path: str, rows: int, k: int, seed: int) -> tuple[float, Fitted]:
    """MLlib reading the table as a DataFrame (a ``VectorAssembler`` makes its vectors), on the clock."""
    from pyspark.ml.feature import VectorAssembler

    t0 = time.perf_counter()
    frame = spark.read.parquet(path)
    frame = VectorAssembler(inputCols=frame.columns, outputCol="features").transform(frame).select("features")
    wall, fitted = run_mllib(frame, rows, k, seed)
    wall = time.perf_counter() - t0
    return wall, fitted._replace(pass_s=wall / max(fitted.iterations, 1))


def run_ours_parquet(spark: Any, path: str, rows: int, dim: int, k: int, seed: int,
                     **options: Any) -> tuple[float, Fitted]:
    """Ours reading the table as a DataFrame, on the clock (``options``: e.g. ``audit=False``)."""
    t0 = time.perf_counter()
    frame = spark.read.parquet(path)
    _, fitted = run_ours(spark.sparkContext, frame, k, seed, rows=rows, dim=dim, **options)
    return time.perf_counter() - t0, fitted


def parquet_rows(spark: Any, x: np.ndarray, args: argparse.Namespace) -> None:
    """Issue 33's case: each library fits the Parquet table read as a DataFrame, warm (the second fit)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="em-vs-mllib-") as folder:
        path = write_parquet(x, folder)
        cases: dict[str, Any] = {
            "MLlib GaussianMixture": lambda: run_mllib_parquet(spark, path, args.rows, args.k, args.seed),
            "ours spark (default)": lambda: run_ours_parquet(spark, path, args.rows, args.dim, args.k, args.seed),
            "ours spark audit=False": lambda: run_ours_parquet(spark, path, args.rows, args.dim, args.k,
                                                               args.seed, audit=False),
            "ours job per pass": lambda: run_ours_parquet(spark, path, args.rows, args.dim, args.k, args.seed,
                                                          direct_channel=False),
        }
        for case in cases.values():  # warm: JIT, MLlib's first-call set-up, our admission of this mesh
            case()
        load = os.getloadavg()
        print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        runs: dict[str, list[tuple[float, Fitted]]] = {name: [] for name in cases}
        for _ in range(args.repeats):  # interleaved, so the machine's load hits every case alike
            for name, case in cases.items():
                runs[name].append(case())
        rows = {name: median_run(found) for name, found in runs.items()}
        print_rows(f"{args.rows:,} x {args.dim}-D full K={args.k} parquet {args.master}", x, rows)
        ours, plain = rows["ours spark (default)"][0], rows["ours spark audit=False"][0]
        print(f"audited / unaudited: {ours / plain:.3f}x (median fits of {args.repeats}, interleaved; walls: "
              + "; ".join(f"{name} " + " ".join(f"{w:.2f}" for w, _ in found) for name, found in runs.items()) + ")")
        load = os.getloadavg()
        print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def median_run(found: list[tuple[float, Fitted]]) -> tuple[float, Fitted]:
    """The run of median wall time among ``found`` (the upper one of an even count)."""
    return sorted(found, key=lambda run: run[0])[len(found) // 2]


def print_rows(label: str, x: np.ndarray, rows: dict[str, tuple[float, Fitted]]) -> None:
    """The table: one row per fit, ratios to MLlib's wall time, log-likelihoods against the best."""
    header = (f"{'case':<30} {'library':<22} {'wall s':>8} {'iters':>6} {'ms/pass':>9} {'start s':>8} "
              f"{'mean ll/row':>14} {'x MLlib':>8}")
    print(header)
    print("-" * len(header))
    scores = {name: score(f.model, x) for name, (_, f) in rows.items()}
    base, best = rows["MLlib GaussianMixture"][0], max(scores.values())
    for name, (wall, f) in rows.items():
        ll = scores[name]
        mark = "" if best - ll <= 1e-3 else "  (below best by %.2e)" % (best - ll)
        start = max(wall - f.pass_s * f.iterations, 0.0)
        print(f"{label:<30} {name:<22} {wall:>8.2f} {f.iterations:>6} {f.pass_s * 1e3:>9.1f} {start:>8.2f} "
              f"{ll:>14.6f} {wall / base:>8.3f}{mark}")


if __name__ == "__main__":
    main()
