"""tests/facade/mixle_style_train.py, a mixle 0.8.2-style script, runs unchanged against mixle_parallel.

Two real CPU ranks started by Lightning Fabric from mixle's ``LightningFabricLauncher().create(plan=...)``
form; the torch_native run is admitted by a certificate the harness produces first.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification import verify
from mixle_parallel.verification.admission import save_certificate

pytestmark = pytest.mark.slow
pytest.importorskip("lightning")
pytest.importorskip("mixle.models.transformer")
SCRIPT = pathlib.Path(__file__).with_name("mixle_style_train.py")
SPEC = "mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative"
_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def test_mixle_style_script_runs_unchanged(tmp_path: pathlib.Path) -> None:
    report = verify(SPEC, ParallelPlan(dp_replicate=2), precision="fp32", workload="mlp")
    assert report.passed, report.summary()
    cert = save_certificate(report.certify(SPEC), tmp_path / "cert.json")
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env["MIXLE_PARALLEL_CERTIFICATE"] = str(cert)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, record in enumerate(records):
        assert record["rank"] == rank and record["coordinate"]["dp_replicate"] == rank
        assert record["mesh"] == [["dp_replicate"], [2]]
        assert record["steps"] == [1, 2, 3]
        # every position of mixle's CausalLM is scored: 2 ranks x 4 rows x 8 positions
        assert record["global_tokens"] == [64, 64, 64] and record["global_examples"] == [8, 8, 8]
    # DDP: the same global mean loss and the same parameters on both ranks
    assert records[0]["losses"] == records[1]["losses"]
    assert records[0]["param_sum"] == records[1]["param_sum"]
