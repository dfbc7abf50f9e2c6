"""Run under ``torchrun --nproc-per-node N``: the shared stochastic-EM case over torch.distributed (gloo).

Each rank writes OUT/rank<r>.json with the case's signature (batch plans, model, steps and passes).
"""

from __future__ import annotations

import json
import os
import sys

from mixle_parallel import encoded_data
from tests.estimation.backends import stochastic_case as case


def main(out: str) -> None:
    rank = int(os.environ["RANK"])
    with encoded_data(case.data(), estimator=case.EST, backend="torchrun", admission="unverified", audit=False,
                      backend_name="gloo", **case.MINIBATCH) as h:
        plans, model, fit = case.signature(h)
        world = h.num_workers
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"world": world, "plans": plans, "model": model, "fit": list(fit)}, f)


if __name__ == "__main__":
    main(sys.argv[1])
