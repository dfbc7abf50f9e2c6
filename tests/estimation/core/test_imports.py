"""Importing the executors and the EM package stays light (no engine, no torch)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_em_import_is_light():
    code = (
        "import sys, mixle_parallel.executors, mixle_parallel.executors.estimation as e;"
        "e.encoded_data([1.0], estimator=e.GaussianEstimator()).close();"
        "heavy = [m for m in ('torch','mpi4py','pyspark','dask','ray','lightning','megatron','mixle') if m in "
        "sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_engine_modules_load_on_first_use():
    code = (
        "import json, sys, mixle_parallel, mixle_parallel.executors.estimation as e\n"
        "lazy = sorted({v for v in e.LAZY_NAMES.values()})\n"
        "def loaded(): return [m for m in lazy if 'mixle_parallel.executors.estimation' + m in sys.modules]\n"
        "before = loaded()\n"
        "assert mixle_parallel.MPIEncodedData is e.MPIEncodedData and 'MPIEncodedData' in mixle_parallel.__all__\n"
        "print(json.dumps([before, loaded(), sorted(set(e.LAZY_NAMES) & set(e.__all__))]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after, overlap = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == [] and after == [".backends.mpi"] and overlap == []


def test_every_lazy_name_is_what_its_module_exports():
    import importlib

    import mixle_parallel.executors.estimation as e

    for name, module in e.LAZY_NAMES.items():
        assert name in importlib.import_module(module, e.__name__).__all__, (name, module)
