"""Resilient EM on real mp workers: a worker killed twice is blacklisted, a driver killed mid-pass resumes."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data
from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation.em_pass.chunks import chunk_bounds, chunk_estep, encode_chunks
from mixle_parallel.executors.estimation.em_pass.statistic_codec import statistic_from_bytes
from mixle_parallel.resilient_em import ResilientMPEncodedData, checkpointed_fold
from tests.estimation.core.resilient_models import KillOnWorker, data, start_model

EST = MixtureEstimator([GaussianEstimator()] * 2)
ROOT = pathlib.Path(__file__).resolve().parents[3]


def _reference(max_its: int, num_chunks: int) -> str:
    model = start_model()
    with encoded_data(data(), estimator=EST, num_chunks=num_chunks) as h:
        for _ in range(max_its):
            model = h.estep(EST, model).model
    return repr(model)


def test_statistic_bytes_round_trip_and_checkpointed_fold_keeps_the_bits():
    chunks = encode_chunks(data(), EST.encoder(), chunk_bounds(6000, 8))
    results = [chunk_estep(c, (EST, start_model())) for c in chunks]
    stats = results[3].stats
    back = statistic_from_bytes(canonical_statistic_bytes(stats))
    assert canonical_statistic_bytes(back) == canonical_statistic_bytes(stats)
    plain = checkpointed_fold(EST, results)
    cut = checkpointed_fold(EST, results, checkpoint_after=4)
    assert plain[0] == cut[0] and canonical_statistic_bytes(plain[1]) == canonical_statistic_bytes(cut[1])
    with pytest.raises(ValueError, match="not canonical statistic bytes"):
        statistic_from_bytes(b"\x80\x04pickle")


def test_a_worker_killed_twice_is_restarted_then_blacklisted_and_the_fit_keeps_its_bits(tmp_path):
    prefix = str(tmp_path / "kill")
    for k in range(2):
        pathlib.Path(f"{prefix}{k}").write_text("")
    est = KillOnWorker(EST, index=1, prefix=prefix, times=2)
    with ResilientMPEncodedData(data(), est, num_workers=3, num_chunks=12, max_retries=2) as h:
        model = h.fit(est, start_model(), max_its=3)
        runner = h.runner
        assert runner.failures == {1: 2} and h.blacklist == {1} and runner.restarts == [1]
        assert runner.live_workers == [0, 2]
    assert not any(pathlib.Path(f"{prefix}{k}").exists() for k in range(2))  # both kills happened
    assert repr(model) == _reference(3, 12)


@pytest.mark.slow
def test_a_driver_killed_mid_pass_resumes_from_its_checkpoint_on_the_same_bits(tmp_path):
    ckpt, out = tmp_path / "fit.json", tmp_path / "out.txt"
    cmd = [sys.executable, "-m", "tests.estimation.core.resilient_models", str(ckpt), str(out)]
    first = subprocess.Popen(cmd, cwd=ROOT)
    deadline = time.monotonic() + 300
    state = None
    while time.monotonic() < deadline and first.poll() is None:
        if ckpt.exists():
            state = json.loads(ckpt.read_text())
            if state["iteration"] >= 1 and state.get("running"):
                break
        time.sleep(0.05)
    assert first.poll() is None, "the first driver ended before it could be killed mid-pass"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = (state["iteration"], state["running"]["groups"])
    assert not out.exists()
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=300)
    resumed, model = out.read_text().splitlines()
    assert ast.literal_eval(resumed)[0] >= killed_at[0] >= 1  # it picked up the checkpoint, not the start
    assert model == _reference(4, 24)
    final = json.loads(ckpt.read_text())
    assert final["iteration"] == 4 and final["running"] is None
    assert len({p["digest"] for p in final["passes"]}) == 4
    assert np.isfinite(float.fromhex(final["passes"][-1]["log_likelihood"]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plant", ["fifo", "link"])
def test_a_planted_checkpoint_is_refused_at_once_naming_it(tmp_path, plant):
    """The EM checkpoint is read like every stored file: a FIFO or a link in its place is refused, never opened
    (a FIFO would block the read forever)."""
    from mixle_parallel.contracts.safe_read import UnsafeFileError

    ckpt = tmp_path / "fit.json"
    if plant == "fifo":
        os.mkfifo(ckpt)
    else:
        (tmp_path / "elsewhere.json").write_text("{}")
        ckpt.symlink_to(tmp_path / "elsewhere.json")
    with ResilientMPEncodedData(data()[:2000], estimator=EST, num_workers=1, checkpoint=str(ckpt)) as handle:
        with pytest.raises(UnsafeFileError, match="fit.json"):
            handle.fit(EST, start_model(), max_its=1)
