"""Ranks agree on admission before they act (issue 34 item 6).

A real 2-rank torchrun world: first both ranks share one trust store and certify in situ (the certificate is
stored there); then rank 0 keeps that store and rank 1 gets a fresh, empty one (per-rank
``MIXLE_PARALLEL_HOME``). Before, rank 0 started DDP under the stored certificate while rank 1 started in-situ
certification, and their collectives met and crashed (gloo ``RuntimeError``). Now every rank ends in the same
``NotAdmittedError`` naming each rank's view, before any executor collective. Real processes: slow.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from .conftest import child_env

pytestmark = pytest.mark.slow

JOB = pathlib.Path(__file__).resolve().parent / "_agreement_job.py"


def _torchrun(out: pathlib.Path, homes: list[pathlib.Path], model: str = "plain") -> list[dict[str, Any]]:
    return _torchrun_logged(out, homes, model)[0]


def _torchrun_logged(out: pathlib.Path, homes: list[pathlib.Path], model: str) -> tuple[list[dict[str, Any]], str]:
    out.mkdir(parents=True)
    env = child_env()
    env.pop("MIXLE_PARALLEL_CERTIFICATE", None)
    # the job imports tests.launchers._in_situ_job: the repository root on its path, as pytest's own
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(JOB.parents[2]), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(JOB), str(out), model, *map(str, homes)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], done.stderr


def test_ranks_with_different_trust_stores_end_in_the_same_clear_error(tmp_path: pathlib.Path) -> None:
    shared = tmp_path / "shared"
    first = _torchrun(tmp_path / "first", [shared, shared])  # same store: certified in situ, stored there
    assert {r.get("admission") for r in first} == {"certified"}, first
    assert list((shared / "certificates").glob("*.json"))

    fresh = tmp_path / "fresh"
    records = _torchrun(tmp_path / "second", [shared, fresh])  # rank 0 has the certificate, rank 1 none
    for rank, record in enumerate(records):
        assert "refused" in record, (rank, record)
        assert "check 'agreement' failed" in record["refused"]
        assert "rank 0: certified under certificate sha256:" in record["refused"]
        assert "rank 1: refused (certificate; would certify in situ)" in record["refused"]
        assert "MIXLE_PARALLEL_HOME" in record["refused"]
    assert records[0]["refused"] == records[1]["refused"]  # the same error on every rank
    assert not (fresh / "certificates").exists() or not list((fresh / "certificates").glob("*.json"))


def test_a_stored_certificate_admits_a_module_only_after_its_probe(tmp_path: pathlib.Path) -> None:
    """Issue 34 item 5: a certificate earned in situ with one module is not reused for another the probe refuses;
    where the probe cannot run the receipt and the run's log say why."""
    shared = tmp_path / "shared"
    first = _torchrun(tmp_path / "first", [shared, shared])  # certified in situ with the plain module
    assert {r.get("admission") for r in first} == {"certified"}, first
    assert all(r["module_probe"].startswith("passed") for r in first)  # the in-situ certificate probed it

    skewed = _torchrun(tmp_path / "skewed", [shared, shared], "skewed")  # the stored certificate fits the plan
    for record in skewed:
        assert "refused" in record, record
        assert "check 'probe' failed" in record["refused"] and "first.weight" in record["refused"]

    normed, log = _torchrun_logged(tmp_path / "normed", [shared, shared], "normed")
    for record in normed:  # a LayerNorm first layer: the probe synthesizes its input and runs (issue 34 item 5)
        assert record.get("admission") == "certified", record
        assert record["module_probe"].startswith("passed: one seeded step"), record
    assert "module probe skipped" not in log


def test_a_rank_dependent_backward_behind_a_layernorm_is_refused_by_the_probe(tmp_path: pathlib.Path) -> None:
    """Issue 34 item 5: the attack behind a LayerNorm first layer was certified with the probe skipped; now the
    probe runs (inputs synthesized from the normalized shape) and refuses it, in situ and under a stored
    certificate alike."""
    fresh = tmp_path / "fresh"
    in_situ = _torchrun(tmp_path / "in_situ", [fresh, fresh], "normed_skewed")  # certifying in situ probes it
    for record in in_situ:
        assert "refused" in record, record
        assert "check 'probe' failed" in record["refused"] and "norm.weight" in record["refused"]
    assert not list(fresh.glob("certificates/*.json"))

    shared = tmp_path / "shared"
    _torchrun(tmp_path / "first", [shared, shared])  # a certificate of the plan family, earned with a plain module
    stored = _torchrun(tmp_path / "stored", [shared, shared], "normed_skewed")
    for record in stored:
        assert "refused" in record, record
        assert "check 'probe' failed" in record["refused"] and "norm.weight" in record["refused"]


@pytest.mark.parametrize("model", ["rms_normed", "batch_normed", "conv1d", "conv2d"])
def test_honest_modules_with_other_first_layers_pass_the_probe(model: str, tmp_path: pathlib.Path) -> None:
    """Inputs are synthesized for RMSNorm, BatchNorm1d, Conv1d and Conv2d first layers too; an honest module passes
    (a batch-norm layer is recomputed on each rank's share, as the executor runs it)."""
    home = tmp_path / "home"
    for record in _torchrun(tmp_path / "out", [home, home], model):  # certified in situ: the probe judged it
        assert record.get("admission") == "certified", record
        assert record["module_probe"].startswith("passed: one seeded step"), record
