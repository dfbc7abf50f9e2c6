"""Cost of the EM E-step SDC audit at the default rate, side by side in one run: per pass, and per fit.

Two mp handles over the same data and starting model, one audited (default: rate 0.05, each audited
chunk recomputed by the driver's reference) and one with ``audit=False``. First their E-steps are called
by hand, interleaved so machine load hits both alike (each pass judged before it returns, as in mixle's own
loop): the median seconds per pass of each and the ratio. Then ``--fits`` whole fits of ``--iters`` passes each
(``fit(handle, ...)``, interleaved), where the fit judges its passes in batches, their samples read in one
request (``em_pass.deferred_judging``): the median seconds per fit and the ratio, the default audited fit
against the unaudited one (issue 33's measure). Both check that the two produce the same bits.

    python benchmarks/em_audit_overhead.py                 # 1,000,000 x 1-D, K=8, mp, 2 workers
    python benchmarks/em_audit_overhead.py --rows 200000 --iters 10
    python benchmarks/em_audit_overhead.py --source dask   # a dask Array on a local cluster
    python benchmarks/em_audit_overhead.py --source spark-df --rows 200000
    python benchmarks/em_audit_overhead.py --source ray --pause 2   # fits two seconds apart, as a user runs them

``--source`` picks where the rows live: ``memory`` (rows in this process, ``--backend``), ``files`` (``.npy``
files, one per worker, read by ``--backend``'s workers), ``spark-df`` (a Parquet table read as a DataFrame),
``spark-rdd`` (an RDD), ``dask`` (a dask Array, one block per worker), ``ray`` (a ``ray.data`` Dataset); the
last four imply their engine. Off memory, the audited chunks' rows are fetched by the driver from the source
for the reference, all of a pass's in one request (about ``rate`` of the rows per pass). ``rows`` and
``collection`` are the earlier spellings of ``memory`` and the engine's own collection.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
    fit,
)

SOURCES = ("memory", "files", "spark-df", "spark-rdd", "dask", "ray", "rows", "collection")
ENGINE_OF = {"spark-df": "spark", "spark-rdd": "spark", "dask": "dask", "ray": "ray"}


def _data(x: np.ndarray, source: str, backend: str, workers: int, tmp: str) -> tuple[object, str, dict[str, object]]:
    """The rows as ``source`` asks, the backend that reads them and the engine options to pass."""
    if source == "collection":
        source = {"spark": "spark-rdd"}.get(backend, backend)
    backend = ENGINE_OF.get(source, backend)
    if source in ("memory", "rows"):
        return x, backend, {}
    if source == "files":
        from mixle_parallel.executors.estimation.sources.files import files

        paths = []
        for i, part in enumerate(np.array_split(x, workers)):
            paths.append(f"{tmp}/part-{i:03d}.npy")
            np.save(paths[-1], part)
        return files(paths), backend, {}
    if source == "dask":
        import dask.array as da
        import distributed

        client = distributed.Client(n_workers=workers, threads_per_worker=1, dashboard_address=":0")
        return da.from_array(x, chunks=-(-len(x) // workers)), backend, {"client": client}
    if source == "ray":
        import ray

        # two handles (audited, plain) hold their actors at once, a CPU each: room for both (the cores are shared)
        ray.init(num_cpus=2 * workers, include_dashboard=False, ignore_reinit_error=True)
        return ray.data.from_numpy(x), backend, {}
    if source in ("spark-df", "spark-rdd"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors run this interpreter
        import pyspark
        from pyspark.sql import SparkSession

        context = pyspark.SparkContext.getOrCreate(pyspark.SparkConf().setMaster(f"local[{workers}]"))
        if source == "spark-rdd":
            return context.parallelize(x.tolist(), workers).cache(), backend, {"client": context}
        import pyarrow as pa
        import pyarrow.parquet as pq

        for i, part in enumerate(np.array_split(x, workers)):
            pq.write_table(pa.table({"x": part}), f"{tmp}/part-{i:03d}.parquet")
        frame = SparkSession(context).read.parquet(tmp).cache()
        frame.count()
        return frame, backend, {"client": context}
    raise SystemExit(f"--source must be one of {', '.join(SOURCES)}, got {source!r}")


def main() -> None:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--components", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--fits", type=int, default=3, help="whole fits of --iters passes per handle (0: none)")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between fits (as a user runs them)")
    parser.add_argument("--backend", default="mp")
    parser.add_argument("--source", choices=SOURCES, default="memory")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    k = args.components
    x = np.concatenate([rng.normal(3.0 * j, 1.0, args.rows // k) for j in range(k)])
    est = MixtureEstimator([GaussianEstimator() for _ in range(k)])
    start = MixtureDistribution([GaussianDistribution(3.0 * j + 0.5, 4.0) for j in range(k)], np.full(k, 1.0 / k))
    tmp = tempfile.mkdtemp(prefix="em-audit-overhead-")
    data, args.backend, engine = _data(x, args.source, args.backend, args.workers, tmp)
    # admission="unverified": a benchmark on this machine's processes, no certificate involved
    audited = encoded_data(data, estimator=est, backend=args.backend, num_workers=args.workers,
                           admission="unverified", **engine)
    plain = encoded_data(data, estimator=est, backend=args.backend, num_workers=args.workers, admission="unverified",
                         audit=False, **engine)
    chunks = audited.num_chunks  # read while open (a closed Ray handle holds none)
    times: dict[str, list[float]] = {"audited": [], "plain": []}
    models = {"audited": start, "plain": start}
    try:
        for it in range(args.iters):
            order = (
                (("audited", audited), ("plain", plain)) if it % 2 == 0 else (("plain", plain), ("audited", audited))
            )
            for name, handle in order:
                t = time.perf_counter()
                models[name] = handle.estep(est, models[name]).model
                times[name].append(time.perf_counter() - t)
        records = audited.audit_records
        fits, fitted = _time_fits({"audited": audited, "plain": plain}, est, start, args.iters, args.fits, args.pause)
    finally:
        audited.close()
        plain.close()
        client = engine.get("client")
        if client is not None and hasattr(client, "scheduler_info"):  # the dask client started above
            client.close()  # type: ignore[attr-defined]  # a distributed.Client
        shutil.rmtree(tmp, ignore_errors=True)
    same = canonical_statistic_bytes(models["audited"].params()) == canonical_statistic_bytes(models["plain"].params())
    a, p = statistics.median(times["audited"]), statistics.median(times["plain"])
    print(f"{args.rows:,} rows x 1-D ({args.source}), K={k}, {args.backend} with {args.workers} workers, "
          f"{chunks} chunks, {args.iters} interleaved iterations")
    print(f"{'':12}{'median s/it':>12}{'mean s/it':>11}")
    for name in ("plain", "audited"):
        print(f"{name:12}{statistics.median(times[name]):12.4f}{statistics.fmean(times[name]):11.4f}")
    audited_chunks = {(r.step, r.unit) for r in records if r.unit.startswith("chunk:")}  # not the opened groups
    print(f"audited chunks: {len(audited_chunks)} of {chunks * args.iters} "
          f"({len([r for r in records if not r.matched])} mismatches); same model bits: {same}")
    print(f"ratio audited / plain (median): {a / p:.3f}x   (mean: "
          f"{statistics.fmean(times['audited']) / statistics.fmean(times['plain']):.3f}x)")
    if args.fits:
        _print_fits(fits, fitted, args.iters, args.fits)


def _time_fits(handles: dict[str, Any], est: Any, start: Any, iters: int, count: int,
               pause: float = 0.0) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """``count`` whole fits of ``iters`` passes on each handle, interleaved, ``pause`` seconds apart: seconds per
    fit, and the last fits."""
    fits: dict[str, list[float]] = {name: [] for name in handles}
    fitted: dict[str, Any] = {}
    for r in range(count):
        for name in (sorted(handles) if r % 2 == 0 else sorted(handles, reverse=True)):
            time.sleep(pause)
            t = time.perf_counter()
            fitted[name] = fit(handles[name], est, max_its=iters, delta=None, prev_estimate=start, progress=False)
            fits[name].append(time.perf_counter() - t)
    return fits, fitted


def _print_fits(fits: dict[str, list[float]], fitted: dict[str, Any], iters: int, count: int) -> None:
    fa, fp = statistics.median(fits["audited"]), statistics.median(fits["plain"])
    same_fit = (canonical_statistic_bytes(fitted["audited"].model.params())
                == canonical_statistic_bytes(fitted["plain"].model.params()))
    print(f"whole fits of {iters} passes, {count} each, interleaved (judged in batches by the fit)")
    print(f"{'':12}{'median s/fit':>13}{'s/pass':>9}")
    for name in ("plain", "audited"):
        print(f"{name:12}{statistics.median(fits[name]):13.3f}{statistics.median(fits[name]) / iters:9.4f}")
    print(f"fit ratio audited / plain (median): {fa / fp:.3f}x; same model bits: {same_fit}")


if __name__ == "__main__":
    main()
