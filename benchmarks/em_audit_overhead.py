"""Per-iteration cost of the EM E-step SDC audit at the default rate, side by side in one run.

Two mp handles over the same data and starting model, one audited (default: rate 0.05, each audited
chunk recomputed by the driver's reference while the workers fold) and one with ``audit=False``;
their E-steps are interleaved so machine load hits both alike. Prints the median seconds per
iteration of each and the ratio audited / plain, and checks both produce the same bits.

    python benchmarks/em_audit_overhead.py                 # 1,000,000 x 1-D, K=8, mp, 2 workers
    python benchmarks/em_audit_overhead.py --rows 200000 --iters 10
    python benchmarks/em_audit_overhead.py --backend dask --source collection   # a dask Array on the cluster

``--source collection`` fits the engine's own collection instead of rows in memory (``dask``: a dask Array of
one block per worker; ``ray``: a ``ray.data`` Dataset; ``spark``: an RDD): the audited chunks' rows are then
fetched by the driver through the engine's data API for the reference (about ``rate`` of the rows per pass).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
)


def _data(x: np.ndarray, source: str, backend: str, workers: int) -> tuple[object, dict[str, object]]:
    """The rows as ``source`` asks (in memory, or ``backend``'s own collection) and the engine options to pass."""
    if source == "rows":
        return x, {}
    if backend == "dask":
        import dask.array as da
        import distributed

        client = distributed.Client(n_workers=workers, threads_per_worker=1, dashboard_address=":0")
        return da.from_array(x, chunks=-(-len(x) // workers)), {"client": client}
    if backend == "ray":
        import ray

        ray.init(num_cpus=workers, include_dashboard=False, ignore_reinit_error=True)
        return ray.data.from_numpy(x), {}
    if backend == "spark":
        import pyspark

        context = pyspark.SparkContext.getOrCreate(pyspark.SparkConf().setMaster(f"local[{workers}]"))
        return context.parallelize(x.tolist(), workers), {"client": context}
    raise SystemExit(f"--source collection needs --backend dask, ray or spark, got {backend!r}")


def main() -> None:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--components", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--backend", default="mp")
    parser.add_argument("--source", choices=("rows", "collection"), default="rows")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    k = args.components
    x = np.concatenate([rng.normal(3.0 * j, 1.0, args.rows // k) for j in range(k)])
    est = MixtureEstimator([GaussianEstimator() for _ in range(k)])
    start = MixtureDistribution([GaussianDistribution(3.0 * j + 0.5, 4.0) for j in range(k)], np.full(k, 1.0 / k))
    data, engine = _data(x, args.source, args.backend, args.workers)
    # admission="unverified": a benchmark on this machine's processes, no certificate involved
    audited = encoded_data(data, estimator=est, backend=args.backend, num_workers=args.workers,
                           admission="unverified", **engine)
    plain = encoded_data(data, estimator=est, backend=args.backend, num_workers=args.workers, admission="unverified",
                         audit=False, **engine)
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
    finally:
        audited.close()
        plain.close()
        client = engine.get("client")
        if client is not None and hasattr(client, "scheduler_info"):  # the dask client started above
            client.close()  # type: ignore[attr-defined]  # a distributed.Client
    same = canonical_statistic_bytes(models["audited"].params()) == canonical_statistic_bytes(models["plain"].params())
    a, p = statistics.median(times["audited"]), statistics.median(times["plain"])
    chunks = audited.num_chunks
    print(
        f"{args.rows:,} rows x 1-D ({args.source}), K={k}, {args.backend} with {args.workers} workers, "
        f"{chunks} chunks, "
        f"{args.iters} interleaved iterations"
    )
    print(f"{'':12}{'median s/it':>12}{'mean s/it':>11}")
    for name in ("plain", "audited"):
        print(f"{name:12}{statistics.median(times[name]):12.4f}{statistics.fmean(times[name]):11.4f}")
    print(
        f"audited chunks: {len({(r.step, r.unit) for r in records})} of {chunks * args.iters} "
        f"({len([r for r in records if not r.matched])} mismatches); same model bits: {same}"
    )
    print(
        f"ratio audited / plain (median): {a / p:.3f}x   (mean: "
        f"{statistics.fmean(times['audited']) / statistics.fmean(times['plain']):.3f}x)"
    )


if __name__ == "__main__":
    main()
