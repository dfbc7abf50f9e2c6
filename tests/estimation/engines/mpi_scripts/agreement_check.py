"""Run under mpiexec or torchrun with a trust store per rank: EM ranks agree on admission first (issue 34 item 6).

``python -m tests.estimation.engines.mpi_scripts.agreement_check BACKEND OUT HOME0 HOME1``: rank r uses HOMEr as
its trust store (``MIXLE_PARALLEL_HOME``), builds an ``encoded_data`` handle on BACKEND with no certificate given
and runs one EM pass; each rank writes ``OUT/rank<r>.json`` with the handle's admission mode and certificate id,
or the refusal's text.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data
from mixle_parallel.contracts import NotAdmittedError
from tests.estimation.engines.mpi_scripts.in_situ_check import _rank


def main(backend: str, out: str, *homes: str) -> None:
    rank = _rank(backend)
    os.environ["MIXLE_PARALLEL_HOME"] = homes[rank]
    rng = np.random.default_rng(3)
    rows = np.concatenate([rng.normal(-2.0, 1.0, 400), rng.normal(3.0, 1.0, 400)])
    estimator = MixtureEstimator([GaussianEstimator(), GaussianEstimator()])
    record: dict[str, object] = {"rank": rank}
    try:
        handle = encoded_data(rows, estimator=estimator, backend=backend, num_chunks=8)
    except NotAdmittedError as exc:
        record["refused"] = str(exc)
    else:
        record.update(admission=handle.admission.mode.value, certificate=handle.admission.certificate_id)
        handle.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:])
