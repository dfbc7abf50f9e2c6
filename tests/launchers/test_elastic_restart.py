"""A real elastic job: torchrun agents, a node lost mid-run, a restart at a smaller world, a DCP reshard.

Two elastic agents on this machine are two nodes of 2 gloo ranks (``--nnodes 1:2 --nproc-per-node
2 --max-restarts 2``, c10d rendezvous on localhost): torch's agent changes the world size only
through node membership. On its first attempt node B's local rank 1 takes the node down before
step 6 commits (examples/elastic/train_elastic.py). Node A's ranks fail on the broken collective,
node A restarts them, re-rendezvouses alone (world 2) and resumes from the step-4 checkpoint saved
at world 4, so step 5 (committed, then lost with the node) is trained again. The kept trajectory
(attempt 0 up to the checkpoint, then attempt 1) must cover every sample exactly once with one
step clock 1..8, and the final parameters must match one uninterrupted process (fp32, rtol 1e-5).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from types import ModuleType
from typing import Any

import pytest

from .conftest import child_env

pytestmark = pytest.mark.slow
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "elastic" / "train_elastic.py"
TIMEOUT_S = 300
FAIL_AT = 6


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_elastic", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _agent(port: int, out: pathlib.Path, *, host: bool, env: dict[str, str], log: pathlib.Path,
           ) -> subprocess.Popen[bytes]:
    conf = f"is_host={int(host)},last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2",
           "--max-restarts", "2", "--monitor-interval", "0.5", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "mixle-elastic-test", "--rdzv-conf", conf,
           str(SCRIPT), str(out)]
    with open(log, "wb") as sink:
        return subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM an agent still running (it stops its workers), then SIGKILL its session if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _run_job(out: pathlib.Path) -> tuple[int, int]:
    from mixle_parallel.verification.harness.mesh import _free_port

    port, env = _free_port(), {**child_env(), "PYTHONUNBUFFERED": "1"}
    env.pop("MIXLE_ELASTIC_FAIL_AT_STEP", None)
    # node B first: it waits for node A's store, so both are in the first round (world 4)
    node_b = _agent(port, out, host=False, env={**env, "MIXLE_ELASTIC_FAIL_AT_STEP": str(FAIL_AT)},
                    log=out / "agent-b.log")
    time.sleep(1.0)
    node_a = _agent(port, out, host=True, env=env, log=out / "agent-a.log")
    try:
        rc_a = node_a.wait(TIMEOUT_S)
        rc_b = node_b.wait(60)
    finally:
        _stop(node_a)
        _stop(node_b)
    return rc_a, rc_b


def _events(out: pathlib.Path) -> dict[tuple[int, int], list[dict[str, Any]]]:
    found: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for path in sorted(out.glob("attempt*-rank*.jsonl")):
        attempt, rank = (int(p) for p in path.stem.removeprefix("attempt").split("-rank"))
        found[(attempt, rank)] = [json.loads(line) for line in path.read_text().splitlines()]
    return found


def test_lost_node_restart_at_world_2_resumes_without_skips_or_repeats(tmp_path: pathlib.Path) -> None:
    example = _example()
    out = tmp_path / "job"
    out.mkdir()
    rc_a, rc_b = _run_job(out)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(out.glob("agent-*.log")))
    assert rc_a == 0, logs  # the surviving node finished the job
    assert rc_b != 0, logs  # the lost node did not
    events = _events(out)
    assert sorted(events) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)], (sorted(events), logs)
    starts = {key: evs[0] for key, evs in events.items()}
    assert all(s["world"] == 4 and s["step"] == 0 for k, s in starts.items() if k[0] == 0)
    # attempt 1: world 2, resumed from the step-4 checkpoint written at world 4 (resharded by DCP)
    assert all((s["world"], s["step"], s["consumed"], s["saved_world"]) == (2, 4, 32, 4)
               for k, s in starts.items() if k[0] == 1)
    killed = [e for evs in events.values() for e in evs if e["event"] == "killed"]
    assert len(killed) == 1 and killed[0]["step"] == FAIL_AT
    receipts = {a: [e for (att, _), evs in sorted(events.items()) if att == a for e in evs if e["event"] == "step"]
                for a in (0, 1)}
    assert all(e["global_examples"] == example.GLOBAL_BATCH and not e["skipped"] for r in receipts.values() for e in r)
    assert sorted({e["step"] for e in receipts[0]}) == [1, 2, 3, 4, 5]  # step 5 committed, then lost
    resumed = starts[(1, 0)]["step"]
    kept = [e for e in receipts[0] if e["step"] <= resumed] + receipts[1]
    # one continuous step clock: attempt 1 picks up at the checkpoint's step + 1 and runs to the end
    assert sorted({e["step"] for e in receipts[1]}) == [5, 6, 7, 8]
    assert sorted(e["step"] for e in kept) == sorted([*range(1, 5)] * 4 + [*range(5, 9)] * 2)
    assert {e["step"] for e in receipts[1] if e["restart"]} == {resumed + 1}  # the resumed step is marked
    assert not any(e["restart"] for e in receipts[0])
    # every sample of the 8 global batches trained exactly once in the kept trajectory, in its own step
    assert sorted(i for e in kept for i in e["ids"]) == list(range(example.STEPS * example.GLOBAL_BATCH))
    for e in kept:
        assert {i // example.GLOBAL_BATCH for i in e["ids"]} == {e["step"] - 1}
    final = json.loads((out / "final.json").read_text())
    assert (final["world"], final["attempt"]) == (2, 1)
    import numpy as np

    for name, value in example.reference().items():
        np.testing.assert_allclose(np.array(final["params"][name]), np.array(value), rtol=1e-5, atol=1e-6)
