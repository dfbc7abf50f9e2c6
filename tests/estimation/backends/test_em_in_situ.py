"""EM certified in situ (issue 23 item 1): ``encoded_data`` under real ``mpiexec -n 2`` and ``torchrun`` on a
fresh trust store.

Before: refused with NotAdmittedError naming `mixle-parallel certify`. Now the job's own ranks run the
harness's Gaussian-mixture workload against the numpy reference, rank 0 signs, every rank is admitted
``certified`` with the same certificate, which records in situ, world size 2 and the transport; a second
run reuses it; with the trust store's policy ``off`` the job is refused naming the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mixle_parallel.verification.attestation import load_certificate, open_envelope
from mixle_parallel.verification.keys import TrustStore
from tests.estimation.backends.engine_helpers import launch_two_ranks

pytestmark = pytest.mark.slow

MODULE = "tests.estimation.backends.mpi_scripts.in_situ_check"


def _launch(backend: str, home: Path, out: Path) -> tuple[list[dict[str, Any]], str]:
    out.mkdir(parents=True)
    return launch_two_ranks(backend, MODULE, [str(out)], home, out)


@pytest.mark.parametrize("backend, transport, launcher", [("mpi", "mpi", "mpiexec"), ("torchrun", "torchrun",
                                                                                         "torchrun")])
def test_em_job_certifies_in_situ_once(backend: str, transport: str, launcher: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    first, stderr = _launch(backend, home, tmp_path / "first")
    assert f"certifying em_{backend}" in stderr
    assert {r.get("admission") for r in first} == {"certified"}, first
    [path] = sorted((home / "certificates").glob("*.json"))
    certificate, _ = open_envelope(load_certificate(path), TrustStore(home))
    assert {r["certificate"] for r in first} == {certificate.certificate_id}
    measurement = certificate.measurement
    assert measurement is not None and measurement.site == "in_situ"
    assert (measurement.world_size, measurement.launcher, measurement.workload) == (2, launcher, "gaussian_mixture")
    assert measurement.probe == "not_applicable"
    assert (certificate.device_kind, certificate.comm_backend) == ("cpu", transport)
    assert [e.node_id for e in certificate.evidence] == ["stats:data"]

    second, stderr = _launch(backend, home, tmp_path / "second")
    assert "certifying" not in stderr
    assert {r["certificate"] for r in second} == {certificate.certificate_id}


def test_em_policy_off_refuses_with_the_command(tmp_path: Path) -> None:
    home = tmp_path / "home"
    TrustStore(home).set_policy("off")
    records, _ = _launch("mpi", home, tmp_path / "out")
    for record in records:
        assert "automatic certification is off" in record["refused"]
        assert "mixle-parallel certify --backend mpi --plan dp_replicate=2" in record["refused"]
