"""Engine backends are registered lazily: importing never loads an engine; a missing one names its extra."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mixle_parallel.contracts.errors import MissingExtraError
from mixle_parallel.executors.estimation import GaussianEstimator, encoded_data
from mixle_parallel.executors.registry import available_encoded_data_backends

ENGINES = ("mpi4py", "pyspark", "dask", "distributed", "ray", "torch")


def test_importing_the_estimation_layer_loads_no_engine():
    code = (
        "import json, sys\n"
        "import mixle_parallel, mixle_parallel.executors, mixle_parallel.executors.estimation as e\n"
        "from mixle_parallel.executors.registry import available_encoded_data_backends as a\n"
        f"print(json.dumps({{'loaded': [m for m in {ENGINES!r} if m in sys.modules], 'names': list(a())}}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == []
    assert {"mpi", "spark", "dask", "ray", "pyspark", "distributed", "mpi4py"} <= set(out["names"])


def test_engine_names_are_registered_in_process():
    assert {"mpi", "spark", "dask", "ray"} <= set(available_encoded_data_backends())


@pytest.mark.parametrize(
    "backend, blocked, extra",
    [
        ("mpi", ("mpi4py", "mpi4py.MPI"), "mpi"),
        ("spark", ("pyspark",), "spark"),
        ("dask", ("distributed",), "dask"),
        ("ray", ("ray",), "ray"),
    ],
)
def test_missing_engine_names_the_extra(monkeypatch, backend, blocked, extra):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # ``import name`` now fails as if not installed
    with pytest.raises(MissingExtraError, match=rf"pip install 'mixle-parallel\[{extra}\]'") as info:
        encoded_data(np.zeros(10), estimator=GaussianEstimator(), backend=backend)
    assert info.value.extra == extra


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), True, "5"])
def test_bad_timeout_is_rejected_before_any_engine_starts(timeout):
    from mixle_parallel.executors.estimation.backends.deadline import check_timeout

    with pytest.raises(ValueError, match="timeout must be a positive number"):
        check_timeout(timeout)


def test_block_assignment_is_contiguous_and_complete():
    from mixle_parallel.executors.estimation.backends.chunk_assignment import block_assignment

    for chunks in range(0, 12):
        for workers in range(1, 5):
            blocks = block_assignment(chunks, workers)
            assert len(blocks) == workers
            assert [i for b in blocks for i in b] == list(range(chunks))
            assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
