"""Run under mpiexec or torchrun with a trust store per rank: EM ranks agree on admission first (issue 34 item 6).

``python -m tests.estimation.backends.mpi_scripts.agreement_check BACKEND OUT HOME0 HOME1``: rank r uses HOMEr as
its trust store (``MIXLE_PARALLEL_HOME``), builds an ``encoded_data`` handle on BACKEND with no certificate given
(``in_situ_check.admission_record``); each rank writes ``OUT/rank<r>.json`` with the handle's admission mode and
certificate id, or the refusal's text.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.estimation.backends.mpi_scripts.in_situ_check import _rank, admission_record


def main(backend: str, out: str, *homes: str) -> None:
    rank = _rank(backend)
    os.environ["MIXLE_PARALLEL_HOME"] = homes[rank]
    record = admission_record(backend)
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:])
