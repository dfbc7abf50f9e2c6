"""examples/em_backend_template.py, the backend author's starting point: it registers, fits with the bits of one
process, refuses what it does not declare, runs as a script and passes the harness by its registered name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import examples.em_backend_template as template
from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, encoded_data, fit
from mixle_parallel.executors.estimation.backends.backend_declaration import backend_declaration
from mixle_parallel.executors.registry import available_encoded_data_backends, verification_target

ROOT = Path(__file__).resolve().parents[3]
X = np.concatenate([np.random.default_rng(1).normal(-2.0, 1.0, 900), np.random.default_rng(2).normal(3.0, 0.5, 900)])
EST = MixtureEstimator([GaussianEstimator()] * 2)


def test_importing_the_template_registers_it_with_its_declarations():
    assert template.NAME in available_encoded_data_backends()
    declared = backend_declaration(template.NAME)
    assert {"num_workers", "timeout"} <= declared.options and not declared.worker_processes
    assert declared.planned is template.planned_workers


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_template_fits_the_bits_of_one_process(workers):
    ours = fit(X, EST, max_its=8, delta=None, seed=4, chunk_size=150, backend=template.NAME, num_workers=workers)
    one = fit(X, EST, max_its=8, delta=None, seed=4, chunk_size=150)
    assert ours.history == one.history and ours.admission == "local"


def test_the_template_refuses_what_it_does_not_declare():
    with pytest.raises(ValueError, match="option comm= is not honoured by backend 'template_em'"):
        encoded_data(X, estimator=EST, backend=template.NAME, comm=object())
    with encoded_data(X, estimator=EST, backend=template.NAME, timeout=5.0) as handle:
        assert handle.runner.timeout == 5.0 and handle.num_workers == template.DEFAULT_WORKERS


def test_the_template_runs_as_a_script():
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "em_backend_template.py")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the same bits as one process" in done.stdout


def test_the_harness_verifies_the_template_by_its_registered_name():
    from mixle_parallel.verification import verify

    report = verify(verification_target(template.NAME), ParallelPlan(dp_replicate=2), precision="fp64",
                    workload="gaussian_mixture")
    assert report.passed
