"""``files(...)`` and rank-local rows on ``mpi``: each rank reads or holds only its own chunks, same bits."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests.estimation.backends import em_case
from tests.estimation.backends.engine_helpers import run_mpi
from tests.estimation.sources import source_case

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def _write_parts(folder, count):
    for i, part in enumerate(np.array_split(em_case.data(), count)):
        np.save(folder / f"part-{i}.npy", part)
    return files_reference(folder)


def files_reference(folder):
    from mixle_parallel import files

    return source_case.source_reference(files(str(folder / "part-*.npy")))


@pytest.mark.parametrize("kind", ["files", "rank_local"])
def test_mpi_ranks_read_their_own_rows_and_fit_the_bits_of_the_same_parts(tmp_path, kind):
    pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
    digest, history = _write_parts(tmp_path, 2)
    for row in run_mpi("source_check.py", 2, kind, str(tmp_path)):
        assert (row["digest"], tuple(row["history"])) == (digest, history), f"rank {row['rank']} differs"


def test_files_on_three_ranks_fit_the_same_bits(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
    digest, history = _write_parts(tmp_path, 2)
    for row in run_mpi("source_check.py", 3, "files", str(tmp_path)):
        assert (row["digest"], tuple(row["history"])) == (digest, history), f"rank {row['rank']} differs"


_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
_REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("kind", ["files", "rank_local"])
def test_torchrun_ranks_read_their_own_rows_and_fit_the_bits_of_the_same_parts(tmp_path, kind):
    pytest.importorskip("torch")
    digest, history = _write_parts(tmp_path, 2)
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    script = _REPO / "tests" / "estimation" / "backends" / "torchrun_scripts" / "source_torchrun.py"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), kind, str(tmp_path)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=str(_REPO))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    for r in range(2):
        row = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert (row["digest"], tuple(row["history"])) == (digest, history), f"rank {r} differs"


def test_rank_local_rows_on_torchrun_ranks_share_counts_only():
    from mixle_parallel.executors.estimation.sources.rank_local import RankLocalRows

    class TwoRanks:  # the collective a torchrun / mpi runner gives, for rank 1 of 2 (no process group here)
        rank, size = 1, 2

        def all_gather(self, value):
            return [5, value]

    opened = RankLocalRows(np.arange(3.0)).open(TwoRanks())
    assert opened.part_rows == (5, 3)
