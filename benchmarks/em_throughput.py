"""EM throughput: our backends vs scikit-learn's GaussianMixture vs mixle 0.8.2, one run, same data
and starting model. Prints a table of per-iteration times and ratios measured side by side.

    python benchmarks/em_throughput.py [--iters 15] [--rounds 4] [--small] [--cases 1d,8d]
        [--engines mp,dask,ray,torchrun] [--no-compute]

Cases: 1,000,000 x 1-D, K=8 and 200,000 x 8-D diagonal, K=8. For each: our ``local`` backend
with one worker, scikit-learn (its own E-step + M-step per iteration), mixle's plain path
(``seq_estimate`` on its single-chunk encoding), and ``mp``/``dask``/``ray`` with 2 workers
against 1, pass by pass (a 1-worker and a 2-worker handle open together, their passes
interleaved, so machine load hits both alike; engines that are not registered/installed are
listed as skipped), next to the machine's own ceiling: the same E-step split over two plain
processes with no engine and no messages. The log-likelihood of the same iterate is compared
with scikit-learn's. The compute engines (numpy, and ``engine="torch"`` in fp64 and fp32 on the
CPU) are timed side by side on one local worker. Targets (issue 4): <= 0.5x scikit-learn's time
per iteration on one core, >= 1.7x from 2 workers, log-likelihood within 1e-9 relative.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import resource
import statistics
import time
import warnings
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per measured engine, as the targets say
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mixle_parallel.executors.estimation import (  # noqa: E402
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
)

REG = 1e-6  # scikit-learn's default reg_covar; ours adds the same to every variance


def peak_rss_mb() -> tuple[float, float]:
    """Peak resident memory (MiB) of this process and of its (waited-for) children."""
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return me, kids


def make_case(name: str, n: int, d: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 6, (k, d))
    labels = rng.integers(0, k, n)
    x = centers[labels] + rng.normal(0, 1, (n, d)) * rng.uniform(0.5, 1.5, (k, d))[labels]
    seeds = x[rng.choice(n, k, replace=False)]  # start means at data rows, as sklearn's "random_from_data"
    if d == 1:
        x = x[:, 0].copy()
        est = MixtureEstimator([GaussianEstimator(reg_var=REG)] * k)
        start = MixtureDistribution(
            [GaussianDistribution(c, 4.0) for c in seeds[:, 0]], np.full(k, 1.0 / k))
    else:
        est = MixtureEstimator([DiagonalGaussianEstimator(d, reg_var=REG)] * k)
        start = MixtureDistribution(
            [DiagonalGaussianDistribution(c, np.full(d, 4.0)) for c in seeds], np.full(k, 1.0 / k))
    return name, x, est, start


def open_ours(x, est, backend="local", workers=1):
    """An encoded-data handle (admission="unverified", audit off: engine throughput only; the audit's
    cost is in benchmarks/em_audit_overhead.py) and its set-up time."""
    t0 = time.perf_counter()
    h = encoded_data(x, estimator=est, backend=backend, num_workers=workers, admission="unverified", audit=False)
    return h, time.perf_counter() - t0


def time_ours(x, est, start, iters, backend="local", workers=1):
    """Median seconds per E/M iteration of one handle, and the log-likelihoods."""
    with open_ours(x, est, backend, workers)[0] as h:
        times, lls = time_passes(h, est, start, iters)
    return statistics.median(times), lls


def time_passes(h, est, start, iters):
    """Seconds of each of ``iters`` E/M iterations from ``start``, and the log-likelihoods."""
    m, times, lls = start, [], []
    for _ in range(iters):
        t = time.perf_counter()
        r = h.estep(est, m)
        times.append(time.perf_counter() - t)
        lls.append(r.log_likelihood)
        m = r.model
    return times, lls


def time_side_by_side(x, est, start, iters, backend, rounds):
    """1 worker against 2 on one engine, pass by pass: ``rounds`` rounds, each opening a 1-worker
    and a 2-worker handle (which opens first alternates), one untimed warm-up pass on each, then
    ``iters`` pairs of passes -- iteration k of the same EM trajectory on each handle, in
    alternating order -- and closing both. A pair's two passes run milliseconds apart, so the
    machine's load, which drifts within a second here, hits both alike; each pair gives a speed-up.
    (The idle handle's engine waits on a socket or pipe meanwhile; with its housekeeping quiet, an
    idle dask cluster takes ~2% of a core, Ray actors ~1%.) Returns per worker count: every timed
    pass, the first round's log-likelihoods and the median set-up time; and every pair's speed-up."""
    times, lls, setups, pairs = {1: [], 2: []}, {1: None, 2: None}, {1: [], 2: []}, []
    for r in range(rounds):
        handles = {}
        try:
            for w in ((1, 2) if r % 2 == 0 else (2, 1)):
                handles[w], setup = open_ours(x, est, backend, w)
                setups[w].append(setup)
            models, round_lls = {}, {1: [], 2: []}
            for w, h in handles.items():
                h.estep(est, start)  # warm-up: first touches of worker memory
                models[w] = start
            for k in range(iters):
                took = {}
                for w in ((1, 2) if k % 2 == 0 else (2, 1)):
                    t = time.perf_counter()
                    out = handles[w].estep(est, models[w])
                    took[w] = time.perf_counter() - t
                    models[w] = out.model
                    round_lls[w].append(out.log_likelihood)
                for w in (1, 2):
                    times[w].append(took[w])
                pairs.append(took[1] / took[2])
            for w in (1, 2):
                lls[w] = round_lls[w] if lls[w] is None else lls[w]
        finally:
            for h in handles.values():
                h.close()
    return times, lls, {w: statistics.median(v) for w, v in setups.items()}, pairs


def _ceiling_worker(x, est, start, part, parts, barrier, queue, passes):
    """One plain process: the E-step of its share of the chunks, ``passes`` times, in step with the others."""
    from mixle_parallel.executors.estimation.backends.worker_process import prepare_worker
    from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk, chunk_bounds, chunk_estep

    prepare_worker()
    enc = est.encoder()
    bounds = chunk_bounds(len(x))
    mine = [EncodedChunk(i, a, b, enc.encode(x[a:b])) for i, (a, b) in enumerate(bounds)
            if (i * parts) // len(bounds) == part]
    times = []
    for _ in range(passes):
        barrier.wait()
        t = time.perf_counter()
        for chunk in mine:
            chunk_estep(chunk, (est, start))
        times.append(time.perf_counter() - t)
    queue.put(times)


def machine_ceiling(x, est, start, rounds, passes=12):
    """What two cores give on this machine with no engine at all: the E-step of all chunks in one
    process against each half in its own process (no messages, a barrier per pass), in alternating
    rounds; the median ratio of the slower half to the whole. Engines cannot beat it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    per_pass = {1: [], 2: []}
    for r in range(rounds):
        for parts in ((1, 2) if r % 2 == 0 else (2, 1)):
            barrier, queue = ctx.Barrier(parts), ctx.Queue()
            procs = [ctx.Process(target=_ceiling_worker, args=(x, est, start, p, parts, barrier, queue, passes))
                     for p in range(parts)]
            for proc in procs:
                proc.start()
            out = [queue.get() for _ in procs]
            for proc in procs:
                proc.join()
            per_pass[parts].extend(max(ts) for ts in list(zip(*out))[2:])  # first two passes warm up
    return statistics.median(per_pass[1]) / statistics.median(per_pass[2])


def start_shared_ray() -> bool:
    """Start one local Ray for every ray handle of the run (each handle would otherwise start and stop
    its own, ~3-4 s apiece); False when Ray is not installed."""
    try:
        import ray
    except ImportError:
        return False
    if not ray.is_initialized():
        # twice the cores in logical CPU slots: the 1-worker and the 2-worker handle are open together
        # (three actors), but only one handle computes at a time
        ray.init(num_cpus=2 * (os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    return True


def sklearn_from(start, x):
    from sklearn.mixture import GaussianMixture

    X = x.reshape(len(x), -1)
    if isinstance(start.components[0], GaussianDistribution):
        means = np.array([[c.mu] for c in start.components])
        var = np.array([[c.sigma2] for c in start.components])
    else:
        means = np.array([c.mu for c in start.components])
        var = np.array([c.var for c in start.components])
    g = GaussianMixture(len(start.components), covariance_type="diag", reg_covar=REG, max_iter=1, tol=0,
                        weights_init=start.weights, means_init=means, precisions_init=1.0 / var)
    g._initialize_parameters(X, np.random.RandomState(0))  # exactly the given start
    return g, X


def time_sklearn(x, start, iters):
    g, X = sklearn_from(start, x)
    times, lls = [], []
    for _ in range(iters):
        t = time.perf_counter()
        log_prob_norm, log_resp = g._e_step(X)
        g._m_step(X, log_resp)
        times.append(time.perf_counter() - t)
        lls.append(float(log_prob_norm) * len(X))
    return statistics.median(times), lls


def time_mixle(x, start, iters):
    try:
        import mixle.stats as ms
        from mixle.stats.compute.sequence import seq_encode, seq_estimate
    except ImportError:
        return None
    if isinstance(start.components[0], GaussianDistribution):
        comps = [ms.GaussianDistribution(c.mu, c.sigma2) for c in start.components]
        est = ms.MixtureEstimator([ms.GaussianEstimator()] * len(comps))
    else:
        comps = [ms.DiagonalGaussianDistribution(c.mu, c.var) for c in start.components]
        est = ms.MixtureEstimator([ms.DiagonalGaussianEstimator()] * len(comps))
    m = ms.MixtureDistribution(comps, start.weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = seq_encode(x, estimator=est)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            m = seq_estimate(enc, est, m)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def time_torchrun(n, d, k, iters, ranks):
    """Per-pass seconds and log-likelihoods of a real ``torchrun --nproc-per-node ranks`` job (gloo)."""
    import json
    import subprocess
    import sys
    import tempfile

    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "em_torchrun_job.py")
    env = {key: v for key, v in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), job,
               str(n), str(d), str(k), str(iters), out]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun job failed: {done.stderr[-2000:]}")
        with open(out) as f:
            got = json.load(f)
    return got["times"], got["lls"]


def torchrun_rows(specs, iters, local_lls):
    """One row per case: torchrun with 2 ranks against 1 (separate jobs), and whether the bits are local's."""
    rows = []
    for (name, n, d, k), lls in zip(specs, local_lls):
        t1, l1 = time_torchrun(n, d, k, iters, 1)
        t2, l2 = time_torchrun(n, d, k, iters, 2)
        m1, m2 = statistics.median(t1), statistics.median(t2)
        same = l1 == l2 == lls
        rows.append((name, "torchrun", m1, m2, m1 / m2, float("nan"), min(t1) / min(t2), same))
        print(f"  torchrun: 1 rank {m1:.4f}s/it, 2 ranks {m2:.4f}s/it, speed-up {m1 / m2:.2f}x, "
              f"same bits as local: {same}", flush=True)
    return rows


COMPUTE_ENGINES = (("numpy", None, None), ("torch fp64", "torch:cpu", "fp64"), ("torch fp32", "torch:cpu", "fp32"))
"""The compute engines timed side by side on the local backend (one worker, one thread)."""


def time_compute_engines(x, est, start, iters, rounds):
    """Every compute engine on one local worker, pass by pass: ``rounds`` rounds, each opening one handle per
    engine (rotating which opens first), one warm-up pass each, then ``iters`` passes of each, the engines'
    passes interleaved in rotating order so the machine's load hits them alike. Returns per engine: the
    median seconds per pass and the largest relative log-likelihood difference from the numpy engine."""
    times = {label: [] for label, _, _ in COMPUTE_ENGINES}
    lls = {label: [] for label, _, _ in COMPUTE_ENGINES}
    for r in range(rounds):
        order = COMPUTE_ENGINES[r % 3:] + COMPUTE_ENGINES[:r % 3]
        handles, models = {}, {}
        try:
            for label, engine, precision in order:
                handles[label] = encoded_data(x, estimator=est, engine=engine, precision=precision,
                                              admission="unverified", audit=False)
                handles[label].estep(est, start)  # warm-up: tensors made, first touches of memory
                models[label] = start
            for k in range(iters):
                for label, _, _ in order[k % 3:] + order[:k % 3]:
                    t = time.perf_counter()
                    out = handles[label].estep(est, models[label])
                    times[label].append(time.perf_counter() - t)
                    models[label] = out.model
                    if r == 0:
                        lls[label].append(out.log_likelihood)
        finally:
            for h in handles.values():
                h.close()
    ref = lls["numpy"]
    return {label: (statistics.median(times[label]),
                    max(abs(a - b) / abs(b) for a, b in zip(lls[label], ref))) for label in times}


def print_compute_table(rows):
    """The compute-engine table: seconds per pass, the ratio to the numpy engine, the log-likelihood gap."""
    if not rows:
        return
    print()
    print("compute engines on the local backend, one worker (CPU, one thread), interleaved passes")
    print(f"{'case':<14}{'engine':>12}{'s/it':>10}{'vs numpy':>10}{'LL rel':>10}")
    for name, label, t, ratio, rel in rows:
        print(f"{name:<14}{label:>12}{t:>10.4f}{ratio:>9.2f}x{rel:>10.1e}")


def compute_rows(name, x, est, start, iters, rounds):
    """One row per compute engine of one case (skipped, with the reason, when torch is not installed)."""
    try:
        got = time_compute_engines(x, est, start, iters, rounds)
    except (ValueError, ImportError) as exc:
        print(f"  compute engines: skipped ({str(exc).splitlines()[0][:90]})")
        return []
    base = got["numpy"][0]
    for label, (t, rel) in got.items():
        print(f"  engine {label}: {t:.4f}s/it ({t / base:.2f}x numpy), max rel LL diff {rel:.1e}", flush=True)
    return [(name, label, t, t / base, rel) for label, (t, rel) in got.items()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: sizes, rounds, cases and engines."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=15, help="timed passes per handle and round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per engine (a 1-worker and a 2-worker handle each)")
    ap.add_argument("--small", action="store_true", help="1/10 of the rows (a quick smoke run)")
    ap.add_argument("--cases", default="1d,8d", help="comma-separated subset of 1d,8d")
    ap.add_argument("--engines", default="mp,dask,ray",
                    help="comma-separated engines timed at 1 and 2 workers (torchrun: separate torchrun jobs)")
    ap.add_argument("--no-compute", action="store_true", help="skip the numpy vs torch compute-engine rows")
    args = ap.parse_args(argv)
    unknown = {c.strip().lower() for c in args.cases.split(",")} - {"1d", "8d"}
    if unknown:
        ap.error(f"--cases: unknown case(s) {sorted(unknown)}; choose from 1d,8d")
    return args


def engine_rows(name: str, x: Any, est: Any, start: Any, args: argparse.Namespace, our_lls: list,
                engines: list[str]) -> tuple[list[tuple], bool]:
    """Each engine at 1 and 2 workers, interleaved: (scaling rows, whether a shared Ray was started)."""
    scaling, shared_ray = [], False
    for backend in [e for e in engines if e != "torchrun"]:
        if backend == "ray" and start_shared_ray():
            shared_ray = True
        try:
            times, lls, setup, pairs = time_side_by_side(x, est, start, args.iters, backend, args.rounds)
        except (ValueError, ImportError) as exc:
            print(f"  {backend}: skipped ({str(exc).splitlines()[0][:90]})")
            continue
        same = lls[1] == lls[2] == our_lls
        med = {w: statistics.median(v) for w, v in times.items()}
        best = {w: min(v) for w, v in times.items()}
        paired = statistics.median(pairs)
        scaling.append((name, backend, med[1], med[2], med[1] / med[2], paired, best[1] / best[2], same))
        quartiles = " ".join(f"{v:.2f}" for v in statistics.quantiles(pairs, n=4))
        print(
            f"  {backend}: 1 worker {med[1]:.4f}s/it, 2 workers {med[2]:.4f}s/it, speed-up {med[1] / med[2]:.2f}x "
            f"(median of {len(pairs)} pairs {paired:.2f}x, quartiles {quartiles}; best passes "
            f"{best[1] / best[2]:.2f}x), set-up {setup[1]:.1f}s/{setup[2]:.1f}s, same bits as local: {same}",
            flush=True,
        )
    return scaling, shared_ray


def print_tables(rows: list[tuple], scaling: list[tuple], ceilings: list[tuple], rounds: int, iters: int) -> None:
    """The per-iteration table against scikit-learn and mixle, then the 2-worker speed-ups."""
    print()
    print(
        f"{'case':<14}{'rows':>10}{'ours s/it':>11}{'sklearn':>10}{'mixle':>9}{'ours/skl':>10}"
        f"{'ours/mixle':>11}{'LL rel':>10}"
    )
    for name, n, ours, sk, mx, rel in rows:
        mx_s = "n/a" if mx is None else f"{mx:.4f}"
        ratio_m = "n/a" if mx is None else f"{ours / mx:.2f}"
        print(f"{name:<14}{n:>10}{ours:>11.4f}{sk:>10.4f}{mx_s:>9}{ours / sk:>10.2f}{ratio_m:>11}{rel:>10.1e}")
    print()
    print(
        f"2 workers vs 1 ({rounds} rounds x {iters} interleaved pairs of passes): speed-up of the "
        "median passes, median of the pairs' own speed-ups, best passes"
    )
    print(
        f"{'case':<14}{'engine':>7}{'1 worker s':>12}{'2 workers s':>13}{'speed-up':>10}{'pairs':>8}{'best':>7}"
        f"{'same bits':>11}"
    )
    for name, backend, t1, t2, ratio, paired, best, same in scaling:
        print(f"{name:<14}{backend:>7}{t1:>12.4f}{t2:>13.4f}{ratio:>9.2f}x{paired:>7.2f}x{best:>6.2f}x{str(same):>11}")
    print(
        "machine ceiling (the E-step over two plain processes, no engine, no messages): "
        + ", ".join(f"{name} {ceiling:.2f}x" for name, ceiling in ceilings)
    )


def main(argv: list[str] | None = None) -> int:
    """Time every case against scikit-learn and mixle, then each engine at 1 and 2 workers, and print the tables."""
    args = parse_args(argv)
    # two dask LocalClusters live side by side here; closing the first restores dask's log level
    # while the second runs, so keep dask's INFO chatter out of the table for good
    logging.getLogger("distributed").setLevel(logging.ERROR)
    scale = 10 if args.small else 1
    wanted = {c.strip().lower() for c in args.cases.split(",")}
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    specs = ([("1-D K=8", 1_000_000 // scale, 1, 8)] if "1d" in wanted else []) + (
        [("8-D diag K=8", 200_000 // scale, 8, 8)] if "8d" in wanted else [])
    local_lls: list = []
    rows, scaling, ceilings, shared_ray, compute = [], [], [], False, []
    for name, x, est, start in (make_case(*spec) for spec in specs):
        gc.collect()
        ours, our_lls = time_ours(x, est, start, args.iters)
        local_lls.append(our_lls)
        sk, sk_lls = time_sklearn(x, start, args.iters)
        mx = time_mixle(x, start, args.iters)
        rel = max(abs(a - b) / abs(b) for a, b in zip(our_lls, sk_lls))
        rows.append((name, len(x), ours, sk, mx, rel))
        print(f"[{name}] rows={len(x)} ours(local,1)={ours:.4f}s sklearn={sk:.4f}s "
              f"mixle={'n/a' if mx is None else f'{mx:.4f}s'} max rel LL diff={rel:.2e}", flush=True)
        compute += [] if args.no_compute else compute_rows(name, x, est, start, args.iters, args.rounds)
        ceiling = machine_ceiling(x, est, start, args.rounds)
        ceilings.append((name, ceiling))
        print(f"  machine ceiling (two plain processes, no engine): {ceiling:.2f}x", flush=True)
        more, started = engine_rows(name, x, est, start, args, our_lls, engines)
        scaling += more
        shared_ray = shared_ray or started
    if "torchrun" in engines:
        scaling += torchrun_rows(specs, args.iters, local_lls)
    if shared_ray:
        import ray

        ray.shutdown()
    print_tables(rows, scaling, ceilings, args.rounds, args.iters)
    print_compute_table(compute)
    me, kids = peak_rss_mb()
    print(f"peak RSS: this process {me:.0f} MiB, children {kids:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
