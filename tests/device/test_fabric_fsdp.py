"""GPU check: LightningFabricLauncher with a sharded plan runs Fabric's own FSDP strategy on 2 GPUs.

Skipped on CPU because Lightning runs its FSDP strategy only on GPUs (``Fabric(accelerator='cpu',
strategy='fsdp')`` raises "FSDP is only available on GPU"); needs 2 CUDA devices (NCCL refuses two
ranks on one GPU). Checks each rank's attestation, FSDP really in use, the group destroyed at exit,
and the final parameters against the single-process reference of the tiny example (same seeds,
same data, SGD momentum, mean loss). Run: ``pytest tests/device/test_fabric_fsdp.py -m device``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")
pytest.importorskip("lightning")

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs 2 CUDA devices: Lightning's FSDP strategy is GPU-only and NCCL needs one GPU per rank",
    ),
]

JOB = pathlib.Path(__file__).resolve().parent / "_fabric_fsdp_job.py"


def test_fabric_fsdp_matches_reference_on_two_gpus(tmp_path: pathlib.Path) -> None:
    from tests.launchers._examples import EXAMPLES, load_example

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    # the job (and Fabric's re-run of it for rank 1) imports the example module tiny_ddp by name
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(JOB), str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    from mixle_parallel.contracts import ParallelPlan

    tiny_ddp = load_example("tiny_ddp")

    plan = ParallelPlan(dp_shard=2)
    reference = tiny_ddp.reference(plan)["params"]  # CPU, one process, whole global batch
    for r, record in enumerate(records):
        assert record["coordinate"] == plan.coordinate(r).as_dict() and record["process_group_rank"] == r
        assert record["strategy"] == "FSDPStrategy" and record["process_group_destroyed"] is True
        assert record["params"].keys() == reference.keys()
        for name, value in reference.items():
            # GPU fp32 (TF32 off) vs CPU fp32 after 3 steps: rounding only
            torch.testing.assert_close(
                torch.tensor(record["params"][name]), torch.tensor(value), rtol=1e-5, atol=1e-5, msg=name
            )
