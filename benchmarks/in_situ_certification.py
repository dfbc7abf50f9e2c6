"""Cost of in-situ certification: seconds a launched run spends certifying on its own ranks vs its step time.

    python benchmarks/in_situ_certification.py [--worlds 2 4] [--steps 20] [--only ddp fsdp2 em-mpi em-torchrun]

Each row is one real launched job on a fresh trust store (a temporary ``MIXLE_PARALLEL_HOME``, so nothing
is found and the run certifies in situ): ``torchrun --nproc-per-node N`` for DDP (``dp_replicate=N``),
FSDP2 (``dp_shard=N``) and EM over ``backend="torchrun"``, ``mpiexec -n N`` for EM over ``backend="mpi"``.
Rank 0 reports the in-situ seconds the certificate records (``InSituMeasurement.seconds``: the reference
workload, the probe of the module, judging and signing), the wall time of ``prepare``/``encoded_data``
(process-group start and the gate included), and the mean time of a training step (a small MLP, 4 rows
per rank) or of an EM iteration (a 2-component Gaussian mixture, 20,000 rows). Targets (issue 23, quiet
machine): <= 5 s for DDP and FSDP2 on 2 ranks, <= 1 s for EM on 2 ranks.
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
from pathlib import Path
from typing import Any

KINDS = ("ddp", "fsdp2", "em-mpi", "em-torchrun")
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _certificate_seconds(home: str) -> float:
    """The in-situ seconds the one stored certificate records."""
    from mixle_parallel.verification.attestation import load_certificate, open_envelope
    from mixle_parallel.verification.keys import TrustStore

    [path] = sorted(Path(home, "certificates").glob("*.json"))
    certificate, _ = open_envelope(load_certificate(path), TrustStore(home))
    assert certificate.measurement is not None, "the certificate was not measured in situ"
    return certificate.measurement.seconds


def _train_rank(kind: str, steps: int) -> dict[str, float]:
    import torch
    from torch import nn

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    world = int(os.environ["WORLD_SIZE"])
    plan = ParallelPlan(dp_replicate=world) if kind == "ddp" else ParallelPlan(dp_shard=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))
    started = time.perf_counter()
    session = get_training_backend("torch_native").prepare(
        model, plan=plan, optimizer="SGD", lr=0.01,
        loss_fn=lambda m, x, y: (((m(x) - y) ** 2).sum(), torch.tensor(x.shape[0])))
    prepared = time.perf_counter() - started
    generator = torch.Generator().manual_seed(int(os.environ["RANK"]))
    batches = [(torch.randn(4, 32, generator=generator), torch.randn(4, 8, generator=generator))
               for _ in range(steps + 1)]
    receipt = session.train_batch(*batches[0])  # warm-up (lazy initialisation)
    assert receipt.extra["admission"] == "certified", dict(receipt.extra)
    started = time.perf_counter()
    for x, y in batches[1:]:
        session.train_batch(x, y)
    step = (time.perf_counter() - started) / steps
    session.close()
    return {"prepare_s": prepared, "step_s": step}


def _em_rank(backend: str, steps: int) -> dict[str, float]:
    import numpy as np

    from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data
    from mixle_parallel.executors.estimation.models import GaussianDistribution, MixtureDistribution

    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.normal(-2.0, 1.0, 10_000), rng.normal(3.0, 1.0, 10_000)])
    estimator = MixtureEstimator([GaussianEstimator(), GaussianEstimator()])
    started = time.perf_counter()
    handle = encoded_data(rows, estimator=estimator, backend=backend, num_chunks=16)
    prepared = time.perf_counter() - started
    assert handle.admission.certified, handle.admission
    model = MixtureDistribution([GaussianDistribution(-1.0, 1.0), GaussianDistribution(1.0, 1.0)], [0.5, 0.5])
    model = handle.estep(estimator, model).model  # warm-up (scatter)
    started = time.perf_counter()
    for _ in range(steps):
        model = handle.estep(estimator, model).model
    step = (time.perf_counter() - started) / steps
    handle.close()
    return {"prepare_s": prepared, "step_s": step}


def worker(kind: str, out: str, steps: int) -> None:
    """One rank of a launched job; rank 0 writes the figures to ``out``."""
    if kind in ("ddp", "fsdp2"):
        figures = _train_rank(kind, steps)
        rank = int(os.environ["RANK"])
    else:
        backend = kind.removeprefix("em-")
        figures = _em_rank(backend, steps)
        if backend == "mpi":
            from mpi4py import MPI

            rank = MPI.COMM_WORLD.Get_rank()
        else:
            rank = int(os.environ["RANK"])
    if rank == 0:
        figures["in_situ_s"] = _certificate_seconds(os.environ["MIXLE_PARALLEL_HOME"])
        Path(out).write_text(json.dumps(figures))


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit("no mpiexec: install the [mpi] extra (mpi4py + mpich)")
    return found


def launch(kind: str, world: int, steps: int) -> dict[str, Any]:
    """Run one job of ``world`` ranks on a fresh trust store; rank 0's figures."""
    with tempfile.TemporaryDirectory(prefix="in-situ-bench-") as folder:
        out = os.path.join(folder, "figures.json")
        env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV and k != "MIXLE_PARALLEL_CERTIFICATE"}
        env.update(MIXLE_PARALLEL_HOME=os.path.join(folder, "home"), OMP_NUM_THREADS="1")
        script = [str(Path(__file__).resolve()), "--worker", kind, "--out", out, "--steps", str(steps)]
        if kind == "em-mpi":
            command = [_mpiexec(), "-n", str(world), sys.executable, *script]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                       *script]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"{kind} on {world} ranks failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.out, args.steps)
        return
    print(f"{'job':<13}{'ranks':>6}{'in situ (s)':>13}{'prepare (s)':>13}{'step (ms)':>11}{'in situ / step':>16}")
    for kind in args.only:
        for world in args.worlds:
            f = launch(kind, world, args.steps)
            print(f"{kind:<13}{world:>6}{f['in_situ_s']:>13.2f}{f['prepare_s']:>13.2f}{f['step_s'] * 1e3:>11.2f}"
                  f"{f['in_situ_s'] / f['step_s']:>16.0f}", flush=True)


if __name__ == "__main__":
    main()
