"""EM ranks agree on admission before they act (issue 34 item 6): real ``mpiexec -n 2`` and ``torchrun`` jobs
with a trust store per rank (``MIXLE_PARALLEL_HOME``).

Before, a rank whose store held a certificate built its handle and entered the backend's collectives while a
rank with an empty store started in-situ certification, and their collectives met (a hang, or an MPI/gloo
crash). Now each rank's admission view is compared in one collective before any EM collective: different views
end in the same ``NotAdmittedError`` on every rank, naming each rank's view; in-situ certification starts only
when every rank may certify. Real processes: slow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mixle_parallel.verification.keys import TrustStore
from tests.estimation.backends.engine_helpers import launch_two_ranks

pytestmark = pytest.mark.slow

MODULE = "tests.estimation.backends.mpi_scripts.agreement_check"
BACKENDS = ["mpi", "torchrun"]


def _launch(backend: str, out: Path, homes: list[Path]) -> list[dict[str, Any]]:
    out.mkdir(parents=True)
    return launch_two_ranks(backend, MODULE, [str(out), *map(str, homes)], homes[0], out)[0]


def _same_agreement_error(records: list[dict[str, Any]]) -> str:
    for rank, record in enumerate(records):
        assert "refused" in record, (rank, record)
        assert "check 'agreement' failed" in record["refused"], record["refused"]
        assert "MIXLE_PARALLEL_HOME" in record["refused"]
    assert records[0]["refused"] == records[1]["refused"]  # the same error on every rank
    return str(records[0]["refused"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_em_ranks_with_different_trust_stores_end_in_the_same_clear_error(backend: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    first = _launch(backend, tmp_path / "first", [shared, shared])  # one store: certified in situ, stored there
    assert {r.get("admission") for r in first} == {"certified"}, first

    fresh = tmp_path / "fresh"
    error = _same_agreement_error(_launch(backend, tmp_path / "second", [shared, fresh]))
    assert "rank 0: certified under certificate sha256:" in error
    assert "rank 1: refused (certificate; would certify in situ)" in error
    assert not list(fresh.glob("certificates/*.json"))  # rank 1 did not certify alone


@pytest.mark.parametrize("backend", BACKENDS)
def test_em_in_situ_certification_starts_only_if_every_rank_may_certify(backend: str, tmp_path: Path) -> None:
    open_home, closed_home = tmp_path / "open", tmp_path / "closed"
    TrustStore(closed_home).set_policy("off")
    error = _same_agreement_error(_launch(backend, tmp_path / "out", [open_home, closed_home]))
    assert "rank 0: refused (certificate; would certify in situ)" in error
    assert "rank 1: refused (certificate; may not certify in situ)" in error
    assert not list(open_home.glob("certificates/*.json"))  # rank 0 did not start certifying alone
