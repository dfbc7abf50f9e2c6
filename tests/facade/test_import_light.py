"""Importing the facade or the contracts loads no heavy engine (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ["torch", "mpi4py", "pyspark", "dask", "distributed", "ray", "lightning", "megatron", "sklearn"]


@pytest.mark.parametrize("module", ["mixle_parallel", "mixle_parallel.contracts", "mixle_parallel.executors",
                                    "mixle_parallel.cli"])
def test_import_loads_no_heavy_engine(module: str) -> None:
    code = (f"import sys, json, {module}\n"
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_facade_exports_public_names() -> None:
    import mixle_parallel

    for name in ["ParallelPlan", "BackendCapabilities", "DistributedUpdate", "ParameterLayout", "StepReceipt",
                 "TorchSessionState", "Resources", "DeviceSpec", "WorkerTopologyAttestation",
                 "attest_worker_coordinate", "register_training_backend", "get_training_backend",
                 "available_training_backends", "register_encoded_data_backend",
                 "available_encoded_data_backends", "AdmissionCertificate", "check_admission",
                 "NumericsEvidence", "SDCAuditRecord", "ParallelAxis", "CollectiveKind", "PayloadKind",
                 "StateLayout", "to_json", "from_json", "__version__"]:
        assert hasattr(mixle_parallel, name), name
    for name in mixle_parallel.__all__:
        assert getattr(mixle_parallel, name) is not None, name
