"""A driver run under a data-segment limit smaller than its files: ``python -m ... ADDRESS FOLDER HEADROOM_MB``.

It connects to the dask scheduler at ADDRESS, then caps its own ``RLIMIT_DATA`` (the soft limit) at what it
uses now plus HEADROOM_MB, fewer bytes than the files under FOLDER hold, and fits ``files(FOLDER/*.npy)``
on the cluster's workers. It prints ``loaded`` if it could read the files itself (the control: it must not),
then ``fitted <log-likelihood>``.
"""

from __future__ import annotations

import glob
import os
import resource
import sys

import numpy as np


def _data_bytes_now() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def main(address: str, folder: str, headroom_mb: int) -> None:
    from distributed import Client

    from mixle_parallel import DiagonalGaussianEstimator, MixtureEstimator, files, fit

    paths = sorted(glob.glob(os.path.join(folder, "*.npy")))
    with Client(address) as client:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = _data_bytes_now() + headroom_mb * 2**20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
        print(f"limit {limit} files {sum(os.path.getsize(p) for p in paths)}", flush=True)
        try:
            held = [np.load(p) for p in paths]
            print("loaded", sum(a.nbytes for a in held), flush=True)
            del held
        except MemoryError:
            print("cannot load the files here", flush=True)
        estimator = MixtureEstimator([DiagonalGaussianEstimator(dim=4) for _ in range(2)])
        result = fit(files(paths), estimator, backend="dask", client=client, max_its=3, delta=None, seed=1,
                     admission="unverified", progress=False)
        print("fitted", result.history[-1], flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
