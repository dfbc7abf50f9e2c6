"""Run under ``torchrun --nproc-per-node N script.py OUT``: mixle 0.8.2's own ``optimize`` drives
``TorchRunEncodedData`` (gloo, audit on), then a forced divergence; each rank writes OUT/rank<r>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mixle_parallel.torchrun import TorchRunEncodedData
from tests.estimation.backends import em_case, spmd_mixle_loop


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    est, start = spmd_mixle_loop.mixle_objects(False)
    # mixle's constructor shape; admission="unverified": a test mesh compared bitwise with the local loop
    with TorchRunEncodedData(em_case.data(), estimator=est, chunk_size=spmd_mixle_loop.CHUNK_SIZE, backend="gloo",
                             admission="unverified") as handle:
        found = spmd_mixle_loop.drive(handle, est, start)
    with TorchRunEncodedData(em_case.data(), estimator=est, chunk_size=spmd_mixle_loop.CHUNK_SIZE,
                             admission="unverified") as handle:
        found["diverged"] = spmd_mixle_loop.diverge(handle, est, start, rank)
    found.update(rank=rank, size=int(os.environ["WORLD_SIZE"]), local=spmd_mixle_loop.local_params(est, start))
    Path(out, f"rank{rank}.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1])
