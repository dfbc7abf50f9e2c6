"""Run under ``torchrun --nproc-per-node N``: fit the shared EM case from a source with backend="torchrun".

``source_torchrun.py KIND FOLDER``: KIND ``files`` (every rank passes ``files(FOLDER/part-*.npy)``) or
``rank_local`` (rank r passes only the rows of ``FOLDER/part-<r>.npy``); each rank writes FOLDER/rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from mixle_parallel import files, fit, rank_local
from tests.estimation.backends import em_case


def main(kind: str, folder: str) -> None:
    rank = int(os.environ["RANK"])
    if kind == "files":
        data = files(os.path.join(folder, "part-*.npy"))
    else:
        data = rank_local(np.load(os.path.join(folder, f"part-{rank}.npy")))
    result = fit(data, em_case.estimator(), backend="torchrun", backend_name="gloo", admission="unverified",
                 **em_case.FIT_KWARGS)
    digest, history = em_case.signature(result)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "digest": digest, "history": list(history)}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
