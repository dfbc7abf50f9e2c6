"""The EM reference audit on SPMD ranks (issue 23 item 5): real ``mpiexec -n 2`` and ``torchrun`` jobs.

Every rank agrees on the audited chunks (drawn with the root's secret), recomputes the reference of those it
owns (under ``root_only`` the root recomputes them all), and the references are shared, so every rank judges
the same and enters the same replays. An honest job passes with the same records on both ranks; a runner that
is honest under the harness (it certifies in situ) and computes on half-overwritten rows in production is
caught on every rank as a backend defect. Before, SPMD handles ran no reference audit: the cheat fitted.

The same holds for sources (``files(...)``: each rank reads its audited chunks again from the file;
``rank_local``: from the rows the rank passed). Before, their audit only replayed chunks on the same rank
through the runner, so a runner cheating the same way on every replay fitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.estimation.backends.engine_helpers import launch_two_ranks

pytestmark = pytest.mark.slow

MODULE = "tests.estimation.backends.mpi_scripts.audit_check"


def _launch(backend: str, tmp: Path, mode: str, root_only: bool = False, data: str = "rows") -> list[dict[str, Any]]:
    out = tmp / f"{backend}-{mode}-{int(root_only)}"
    out.mkdir(parents=True)
    if data == "files":
        rng = np.random.default_rng(3)  # the rows audit_check.py fits, one file per rank's half
        rows = np.concatenate([rng.normal(-2.0, 1.0, 800), rng.normal(3.0, 1.0, 800)])
        for i, part in enumerate(np.split(rows, 2)):
            np.save(tmp / f"part-{i}.npy", part)
        data = f"files:{tmp}"
    args = [str(out), mode, "1" if root_only else "0", data]
    ranks, _ = launch_two_ranks(backend, MODULE, args, tmp / "home", out)
    return ranks


@pytest.mark.parametrize("backend, root_only", [("mpi", False), ("mpi", True), ("torchrun", False)])
def test_an_honest_spmd_job_passes_the_reference_audit_the_same_on_every_rank(backend, root_only, tmp_path):
    ranks = _launch(backend, tmp_path, "honest", root_only)
    assert all("error" not in r and r["admission"] == "certified" for r in ranks), ranks
    assert ranks[0]["records"] == ranks[1]["records"] and ranks[0]["digest"] == ranks[1]["digest"]
    records = ranks[0]["records"]
    assert records and {r[0] for r in records} == {"reference"} and all(r[3] for r in records)


@pytest.mark.parametrize("backend", ["mpi", "torchrun"])
def test_a_runner_cheating_outside_the_harness_is_a_backend_defect_on_every_rank(backend, tmp_path):
    ranks = _launch(backend, tmp_path, "cheat")
    assert [r["admission"] for r in ranks] == ["certified", "certified"]  # it behaved under the harness
    assert [r.get("error") for r in ranks] == ["BackendDefectError", "BackendDefectError"], ranks
    assert ranks[0]["records"] == ranks[1]["records"]
    bad = [r for r in ranks[0]["records"] if not r[3]]
    assert [(r[0], r[4]) for r in bad] == [("reference", "backend_defect")]


@pytest.mark.parametrize("backend, how", [("mpi", "scale"), ("torchrun", "drop")])
def test_a_rank_with_honest_digests_and_a_wrong_folded_sum_is_a_backend_defect_on_every_rank(backend, how, tmp_path):
    """Each rank folds the groups it owns; the groups holding audited chunks are opened (the owner rank hands back
    the results it kept, all-gathered) and re-folded on every rank, so every rank raises the same error."""
    ranks = _launch(backend, tmp_path, how)
    assert [r["admission"] for r in ranks] == ["certified", "certified"]
    assert [r.get("error") for r in ranks] == ["BackendDefectError", "BackendDefectError"], ranks
    assert ranks[0]["records"] == ranks[1]["records"]
    bad = [r for r in ranks[0]["records"] if not r[3]]
    assert [(r[0], r[2].split(":")[0], r[4]) for r in bad] == [("reference", "group", "backend_defect")]


@pytest.mark.parametrize("backend, data", [("mpi", "files"), ("mpi", "rank_local"), ("torchrun", "files")])
def test_an_honest_spmd_job_over_a_source_is_audited_against_chunks_each_rank_reads_again(backend, data, tmp_path):
    ranks = _launch(backend, tmp_path, "honest", data=data)
    assert all("error" not in r and r["admission"] == "certified" for r in ranks), ranks
    assert ranks[0]["records"] == ranks[1]["records"] and ranks[0]["digest"] == ranks[1]["digest"]
    records = ranks[0]["records"]
    assert records and {r[0] for r in records} == {"reference"} and all(r[3] for r in records)
    assert {r[2] for r in records} & {f"chunk:{c}" for c in range(8)}, records  # rank 0's chunks among them
    assert {r[2] for r in records} & {f"chunk:{c}" for c in range(8, 16)}, records  # and rank 1's
    assert [r["plain_digest"] for r in ranks] == [r["digest"] for r in ranks]  # the audit changes no bit


@pytest.mark.parametrize("backend, data", [("mpi", "files"), ("mpi", "rank_local"), ("torchrun", "files")])
def test_a_runner_cheating_on_a_source_outside_the_harness_is_a_backend_defect_on_every_rank(backend, data,
                                                                                             tmp_path):
    ranks = _launch(backend, tmp_path, "cheat", data=data)
    assert [r["admission"] for r in ranks] == ["certified", "certified"]  # it behaved under the harness
    assert [r.get("error") for r in ranks] == ["BackendDefectError", "BackendDefectError"], ranks
    assert ranks[0]["records"] == ranks[1]["records"]
    bad = [r for r in ranks[0]["records"] if not r[3]]
    assert [(r[0], r[4]) for r in bad] == [("reference", "backend_defect")]
