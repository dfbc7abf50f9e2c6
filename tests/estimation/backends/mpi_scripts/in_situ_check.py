"""Run under mpiexec or torchrun with no certificate anywhere: ``encoded_data`` certifies in situ (issue 23 item 1).

``python -m tests.estimation.backends.mpi_scripts.in_situ_check BACKEND OUT``: each rank writes ``OUT/rank<r>.json``
with the handle's admission mode and certificate id, or the refusal's text.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data
from mixle_parallel.contracts import NotAdmittedError


def _rank(backend: str) -> int:
    if backend == "mpi":
        from mpi4py import MPI

        return int(MPI.COMM_WORLD.Get_rank())
    return int(os.environ["RANK"])


def admission_record(backend: str) -> dict[str, object]:
    """This rank's ``encoded_data`` handle on ``backend`` with no certificate given: its rank and admission mode and
    certificate id, or the refusal's text."""
    rng = np.random.default_rng(3)
    rows = np.concatenate([rng.normal(-2.0, 1.0, 400), rng.normal(3.0, 1.0, 400)])
    estimator = MixtureEstimator([GaussianEstimator(), GaussianEstimator()])
    record: dict[str, object] = {"rank": _rank(backend)}
    try:
        handle = encoded_data(rows, estimator=estimator, backend=backend, num_chunks=8)
    except NotAdmittedError as exc:
        record["refused"] = str(exc)
    else:
        record.update(admission=handle.admission.mode.value, certificate=handle.admission.certificate_id)
        handle.close()
    return record


def main(backend: str, out: str) -> None:
    record = admission_record(backend)
    Path(out, f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:])
