"""In-situ certification (issue 23 item 1): a plain torchrun script with ``prepare`` on a fresh machine.

Before: refused with NotAdmittedError naming `mixle-parallel certify`. Now the run certifies on its own two
ranks before its first step (the harness's MLP workload against the single-process reference, plus a probe
of the user's module), receipts say ``certified``, the stored certificate says in situ, world size 2, cpu/gloo
and the probe's outcome, and a second run reuses it. A module whose gradient the multi-rank path corrupts is
refused. Real torchrun processes: slow.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from mixle_parallel.contracts import AdmissionCertificate
from mixle_parallel.verification.attestation import load_certificate, open_envelope
from mixle_parallel.verification.keys import TrustStore

from .conftest import child_env

pytestmark = pytest.mark.slow

JOB = pathlib.Path(__file__).resolve().parent / "_in_situ_job.py"
CERTIFYING = "mixle-parallel: certifying torch_native"


def _torchrun(home: pathlib.Path, out: pathlib.Path, mode: str) -> tuple[list[dict[str, Any]], str]:
    """Run the job on 2 ranks with ``home`` as the trust store; per-rank records and the job's stderr."""
    out.mkdir(parents=True)
    env = {**child_env(), "MIXLE_PARALLEL_HOME": str(home)}
    env.pop("MIXLE_PARALLEL_CERTIFICATE", None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(JOB), str(out), mode], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], done.stderr


def _stored(home: pathlib.Path) -> list[AdmissionCertificate]:
    trust = TrustStore(home)
    return [open_envelope(load_certificate(p), trust)[0] for p in sorted((home / "certificates").glob("*.json"))]


def test_ddp_run_certifies_in_situ_once_and_reuses_it(tmp_path: pathlib.Path) -> None:
    home = tmp_path / "home"
    first, stderr = _torchrun(home, tmp_path / "first", "ddp")
    assert stderr.count(CERTIFYING) == 1  # rank 0 says so once for the job (it was once per rank)
    phases = [line.split("] ", 1)[1] for line in stderr.splitlines() if line.startswith("mixle-parallel: in situ [")]
    assert phases == ["1/3 the reference workload 'mlp' on 2 ranks",
                      "2/3 the probe of your module (a copy) against a one-rank recomputation",
                      "3/3 judging the evidence and signing on rank 0", "certified"], stderr[-3000:]
    assert {r["admission"] for r in first} == {"certified"}
    [certificate] = _stored(home)
    assert {r["certificate"] for r in first} == {certificate.certificate_id}
    measurement = certificate.measurement
    assert measurement is not None and measurement.site == "in_situ"
    assert (measurement.world_size, measurement.launcher, measurement.workload) == (2, "torchrun", "mlp")
    assert (certificate.device_kind, certificate.comm_backend) == ("cpu", "gloo")
    assert measurement.probe == "passed" and measurement.probe_max_abs_error is not None
    assert {e.node_id for e in certificate.evidence} == {"grad:dp_replicate", "metric:dp"}

    second, stderr = _torchrun(home, tmp_path / "second", "ddp")
    assert CERTIFYING not in stderr
    assert {r["certificate"] for r in second} == {certificate.certificate_id}
    assert {r["admission"] for r in second} == {"certified"}
    assert len(_stored(home)) == 1


def test_fsdp2_run_certifies_in_situ(tmp_path: pathlib.Path) -> None:
    home = tmp_path / "home"
    records, _ = _torchrun(home, tmp_path / "out", "fsdp")
    assert {r["admission"] for r in records} == {"certified"}
    [certificate] = _stored(home)
    assert certificate.measurement is not None and certificate.measurement.probe == "passed"
    assert {e.node_id for e in certificate.evidence} == {"param:dp_shard", "grad:dp_shard", "metric:dp"}


def test_module_whose_gradient_the_ranks_corrupt_is_refused(tmp_path: pathlib.Path) -> None:
    home = tmp_path / "home"
    records, _ = _torchrun(home, tmp_path / "out", "skewed")
    for record in records:
        assert "refused" in record, record
        assert "check 'probe' failed" in record["refused"]
        assert "first.weight" in record["refused"]
    assert not (home / "certificates").exists() or not os.listdir(home / "certificates")
