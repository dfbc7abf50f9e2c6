"""Engine workers are set up for numeric passes: freed numpy temporaries kept for reuse (no page faults on
every E-step), batch scheduling (a woken worker does not preempt the driver)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mixle_parallel.executors.estimation.backends.mp import MPChunkRunner
from mixle_parallel.executors.estimation.backends.worker_process import keep_freed_memory
from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk
from tests.estimation.backends import chunk_probes as probes
from tests.estimation.backends.engine_helpers import REPO_ROOT

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="glibc's malloc thresholds and SCHED_BATCH are what is tuned, and both are Linux's",
)

_FRESH = """
from tests.estimation.backends import chunk_probes
if {tuned}:
    from mixle_parallel.executors.estimation.backends.worker_process import keep_freed_memory
    assert keep_freed_memory()
print(chunk_probes.page_faults_per_pass(None, {{}}))
"""


def _fresh_process_faults(tuned: bool) -> float:
    code = _FRESH.format(tuned=tuned)  # run from the repository root, where tests.estimation imports
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def test_keep_freed_memory_stops_per_pass_page_faults_in_a_fresh_process() -> None:
    untuned, tuned = _fresh_process_faults(False), _fresh_process_faults(True)
    assert untuned > 200, f"a fresh glibc process was expected to trim its heap every pass ({untuned} faults)"
    assert tuned < 20, f"{tuned} page faults per pass after keep_freed_memory()"


def test_mp_workers_start_with_freed_memory_kept() -> None:
    assert keep_freed_memory() is True  # Linux/glibc here; False elsewhere, where nothing changes
    runner = MPChunkRunner(2, timeout=120)
    try:
        runner.scatter([EncodedChunk(i, i, i + 1, np.zeros(1)) for i in range(2)])
        faults = runner.map_chunks(probes.page_faults_per_pass, {})
        policies = {os.sched_getscheduler(pid) for pid in runner.worker_pids()}
    finally:
        runner.close()
    assert max(faults) < 20, f"mp workers page-fault {faults} times per pass: their heap is trimmed every pass"
    assert policies == {os.SCHED_BATCH}, f"mp workers run under scheduling policies {policies}, not SCHED_BATCH"
