"""Run under mpiexec or torchrun: an audited EM fit whose reference audit runs on every rank (issue 23 item 5).

``python -m tests.estimation.backends.mpi_scripts.audit_check BACKEND OUT MODE ROOT_ONLY [DATA]``: MODE ``honest``,
``cheat`` (the runner computes its chunks on half-overwritten rows except while the harness is active, so the
in-situ certification passes and the fit does not), or ``scale`` / ``drop`` (outside the harness the rank returns
honest chunk digests but a wrong folded sum: ``tests.estimation.audit.fold_cheats``). DATA ``rows`` (default: the
rows in memory), ``files:FOLDER`` (every rank passes ``files(FOLDER/part-*.npy)``) or ``rank_local`` (rank r passes
the r-th half of the rows). Each rank writes ``OUT/rank<r>.json``: the admission, the error raised (its class
name), every audit record (replay, chunk, matched, cause), the fitted model's digest and, honest, the digest of the
same fit unaudited.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
    files,
    fit,
    rank_local,
)
from mixle_parallel.verification.capability import active_harness_capability
from tests.estimation.audit.test_reference_audit import overwrite_half


class CheatingChunks(dict):
    """A rank's chunks that read half-overwritten outside the harness."""

    def __getitem__(self, key: Any) -> Any:
        chunk = super().__getitem__(key)
        return chunk if active_harness_capability() is not None else overwrite_half(chunk)


def _cheat(runner_class: Any) -> None:
    original = runner_class.scatter

    def scatter(self: Any, chunks: Any) -> None:
        original(self, chunks)
        self._local = CheatingChunks(self._local)

    runner_class.scatter = scatter


def _rank(backend: str) -> int:
    if backend == "mpi":
        from mpi4py import MPI

        return int(MPI.COMM_WORLD.Get_rank())
    return int(os.environ["RANK"])


def _cheat_folds(backend: str, how: str) -> None:
    import importlib

    from tests.estimation.audit.fold_cheats import cheating_apply

    module: Any = importlib.import_module(f"mixle_parallel.executors.estimation.backends.{backend}")
    module.apply_chunk_fn = cheating_apply(module.apply_chunk_fn, how)


def _data(kind: str, rows: np.ndarray, rank: int, root_only: str) -> Any:
    """What this rank passes as ``data=``: its rows, a ``files(...)`` source or its ``rank_local`` half."""
    if kind.startswith("files:"):
        return files(os.path.join(kind.removeprefix("files:"), "part-*.npy"))
    if kind == "rank_local":
        return rank_local(np.split(rows, 2)[rank])
    return rows if (rank == 0 or root_only != "1") else None


def _fit(data: Any, backend: str, root_only: str, **audit: Any) -> dict[str, Any]:
    """The audited (or, with ``audit=False``, plain) fit of ``data``: the handle's admission, digest or error,
    and its audit records."""
    estimator = MixtureEstimator([GaussianEstimator(), GaussianEstimator()])
    start = MixtureDistribution([GaussianDistribution(-1.0, 2.0), GaussianDistribution(1.0, 2.0)], [0.5, 0.5])
    record: dict[str, Any] = {}
    with encoded_data(data, estimator=estimator, backend=backend, num_chunks=16, root_only=root_only == "1",
                      **audit) as handle:
        record["admission"] = handle.admission.mode.value
        try:
            result = fit(handle, estimator, max_its=4, delta=None, prev_estimate=start)
            record["digest"] = canonical_statistic_bytes(result.model.params()).hex()
        except Exception as exc:  # noqa: BLE001 - what each rank raised is what the test compares
            record["error"] = type(exc).__name__
        record["records"] = [(r.replay, r.step, r.unit, r.matched, r.cause) for r in handle.audit_records]
    return record


def main(backend: str, out: str, mode: str, root_only: str, kind: str = "rows") -> None:
    if mode in ("scale", "drop"):
        _cheat_folds(backend, mode)
    if mode == "cheat":
        from mixle_parallel.executors.estimation.backends.mpi import MPIRunner
        from mixle_parallel.executors.estimation.backends.torchrun import TorchRunRunner

        _cheat(MPIRunner if backend == "mpi" else TorchRunRunner)
    rank = _rank(backend)
    rng = np.random.default_rng(3)
    rows = np.concatenate([rng.normal(-2.0, 1.0, 800), rng.normal(3.0, 1.0, 800)])
    record = _fit(_data(kind, rows, rank, root_only), backend, root_only, audit_rate=0.3, audit_policy="raise")
    record["rank"] = rank
    if mode == "honest":
        record["plain_digest"] = _fit(_data(kind, rows, rank, root_only), backend, root_only, audit=False).get("digest")
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:])
