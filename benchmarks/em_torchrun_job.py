"""One torchrun job of ``em_throughput.py --engines torchrun``: time EM passes over torch.distributed.

    torchrun --standalone --nproc-per-node N benchmarks/em_torchrun_job.py N_ROWS D K ITERS OUT.json

The root rank writes the seconds of each pass and the log-likelihoods to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys

from em_throughput import make_case, time_passes  # the script's folder is on sys.path under torchrun

from mixle_parallel.executors.estimation import encoded_data


def main(argv: list[str]) -> None:
    n, d, k, iters, out = int(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    _, x, est, start = make_case("torchrun", n, d, k)
    with encoded_data(x, estimator=est, backend="torchrun", admission="unverified", audit=False) as h:
        time_passes(h, est, start, 2)  # warm-up
        times, lls = time_passes(h, est, start, iters)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out, "w") as f:
            json.dump({"times": times, "lls": lls}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
