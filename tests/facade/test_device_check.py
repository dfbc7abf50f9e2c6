"""``scripts/device-check`` runs to the end on a machine without CUDA, and its parts' logic works on the CPU.

The GPU results come from a lent device machine (docs/benchmarks.md); what these tests hold is the script
itself: without CUDA every GPU part is reported ``not run (no device)`` and it exits 0, the device tests run
with a JUnit report whose skips are listed by reason, and ``--cpu-dry-run`` drives the EM comparison, the
bf16 certificate and the in-situ certification through the same code on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device-check"
GPU_PARTS = ("em", "bf16", "in_situ")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device path; this machine has CUDA")


def _run(out: Path, *args: str, timeout: int) -> dict:
    env = dict(os.environ, MIXLE_VENV=str(Path(sys.executable).parents[1]))
    done = subprocess.run([str(SCRIPT), str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "summary.md").read_text() in done.stdout  # the table it printed is the one it wrote
    return json.loads((out / "summary.json").read_text())


def test_without_cuda_every_gpu_part_is_reported_not_run_and_the_check_exits_0(tmp_path: Path) -> None:
    parts = _run(tmp_path / "out", "--parts", "environment," + ",".join(GPU_PARTS), timeout=300)
    assert parts["environment"]["cuda"] is False
    assert parts["environment"]["torch"] == torch.__version__
    for name in GPU_PARTS:
        assert parts[name] == {"status": "not run (no device)"}, name
    assert "| em | not run (no device) |" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.slow
def test_device_tests_run_with_a_junit_report_and_every_skip_says_why(tmp_path: Path) -> None:
    out = tmp_path / "out"
    tests = _run(out, "--parts", "environment,tests", timeout=900)["tests"]
    assert tests["status"] == "ok" and tests["failed"] == 0 and tests["passed"] == 0
    assert tests["skipped"] >= 25  # every device test is collected and skipped here, not left out
    reasons = tests["skip_reasons"]
    assert sum(reasons.values()) == tests["skipped"]
    assert any("2 CUDA devices" in r for r in reasons), reasons  # multi-GPU tests stay skipped and say so
    assert "<testsuite" in (out / "junit-device.xml").read_text()


@pytest.mark.slow
def test_cpu_dry_run_drives_em_bf16_and_in_situ_through_the_same_code(tmp_path: Path) -> None:
    out = tmp_path / "out"
    parts = _run(out, "--cpu-dry-run", "--em-rows", "8000", "--parts", ",".join(GPU_PARTS), timeout=900)
    em = parts["em"]
    assert em["status"] == "ok" and em["device"] == "cpu (dry run)" and em["rows"] == 8000
    by_library = {r["library"]: r for r in em["results"]}
    assert set(by_library) == {"torch:cpu fp64", "numpy (cpu)", "scikit-learn (cpu)"}
    assert all(r["status"] == "ok" and r["converged"] for r in by_library.values())
    # the torch kernel in fp64 reaches the numpy kernel's log-likelihood (the CUDA rows are compared the same way)
    assert by_library["torch:cpu fp64"]["mean_ll"] == pytest.approx(by_library["numpy (cpu)"]["mean_ll"], abs=1e-9)
    bf16 = parts["bf16"]
    assert bf16["status"] == "ok" and bf16["evidence"], bf16
    assert all(e["max_abs"] >= 0 and not e["tolerance"]["bitwise"] for e in bf16["evidence"])
    in_situ = parts["in_situ"]
    assert in_situ["status"] == "ok" and in_situ["admission"] == "certified" and in_situ["world_size"] == 2
    assert in_situ["certificate"].startswith("sha256:")
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "summary.json", "summary.md"]  # no scratch left
