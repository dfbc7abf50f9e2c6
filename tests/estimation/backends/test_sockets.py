"""No engine we start listens outside loopback (issue 24 item 7).

Each fit runs in a fresh process (so the engine starts its own local cluster: LocalCluster,
ray.init, a SparkContext, mp workers) while a sampler lists the listening sockets of that process
and all its children (psutil); every one must be bound to 127.0.0.1 or ::1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.estimation.backends.engine_helpers import REPO_ROOT

pytestmark = pytest.mark.slow
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}  # the last: IPv4 loopback on a dual-stack socket


@pytest.mark.parametrize("backend, module", [("mp", None), ("dask", "distributed"), ("ray", "ray"),
                                             ("spark", "pyspark")])
def test_a_local_fit_listens_only_on_loopback(backend, module):
    if module is not None:
        pytest.importorskip(module)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
                                                        if p)}
    out = subprocess.run([sys.executable, "-m", "tests.estimation.backends.socket_probe", backend], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["samples"] > 0
    public = [s for s in report["listening"] if s[2] not in LOOPBACK]
    assert not public, f"{backend} listens outside loopback: {public}"
