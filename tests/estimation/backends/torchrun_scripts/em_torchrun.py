"""Run under ``torchrun --nproc-per-node N``: one EM fit over torch.distributed (gloo); rank records to OUT.

Each rank writes OUT/rank<r>.json: the fitted model's repr, the log-likelihood, the statistics'
digest of one E-step, the tree peers it received from, and the records of the handle's passes.
A second fit with ``root_only=True`` (rows only on the root) is recorded too.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data, optimize
from mixle_parallel.contracts.estimation import statistic_digest
from mixle_parallel.torchrun import TorchRunEncodedData, torchrun_out


def data() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate([rng.normal(-4, 1.0, 2000), rng.normal(0, 0.5, 2000), rng.normal(5, 1.5, 2000)])


def main(out: str) -> None:
    x = data()
    est = MixtureEstimator([GaussianEstimator()] * 3)
    rank = int(os.environ["RANK"])
    with encoded_data(x, estimator=est, backend="torchrun", num_chunks=12, admission="unverified", audit=False,
                      backend_name="gloo") as h:
        model = optimize(h, est, max_its=6, seed=3)
        ll = h.pysp_seq_log_density_sum(model)[1]
        digest = statistic_digest(h.estep(est, model).stats)
        steps = h.runner.tree_steps
        records = [(r.rank, r.round, r.chunks, r.n_obs) for r in h.rank_records]
        world = h.num_workers
    with encoded_data(x if rank == 0 else None, estimator=est, backend="torchrun", num_chunks=12, root_only=True,
                      admission="unverified", audit=False) as h2:
        root_only_model = optimize(h2, est, max_its=6, seed=3)
    with TorchRunEncodedData(x, est, num_chunks=12, admission="unverified", audit=False) as h3:  # mixle's form
        mixle_form_model = optimize(h3, est, max_its=6, seed=3)
        mixle_form_type = type(h3).__name__
    print(f"fitted on {world} ranks: ll={ll}", file=torchrun_out())
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"model": repr(model), "ll": ll, "digest": digest, "steps": steps, "records": records,
                   "world": world, "root_only_model": repr(root_only_model),
                   "mixle_form_model": repr(mixle_form_model), "mixle_form_type": mixle_form_type}, f)


if __name__ == "__main__":
    main(sys.argv[1])
