"""Defaults that warn: ConvergenceWarning at max_its, scikit-learn's ``tol=`` beside mixle's ``delta=``, and
progress shown on a terminal (a real pseudo-terminal) but never written into a pipe unless asked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import mixle_parallel
from mixle_parallel import ConvergenceWarning
from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, fit, optimize

ROOT = Path(__file__).resolve().parents[3]


def _mixture() -> MixtureEstimator:
    return MixtureEstimator([GaussianEstimator()] * 3)


def test_a_fit_that_runs_out_of_max_its_warns_with_its_own_class(gmm_1d):
    with pytest.warns(ConvergenceWarning, match=r"max_its=3 after 3 iterations.*last gain of the log-likelihood "
                                                r"was [0-9.e+-]+, not below delta=1e-09") as caught:
        res = fit(gmm_1d, _mixture(), max_its=3, seed=0)
    assert res.stop_reason == "max_its" and not res.converged
    assert issubclass(ConvergenceWarning, UserWarning) and ConvergenceWarning.__module__.startswith("mixle_parallel")
    assert caught[0].filename == __file__  # pointed at the caller's line, as warnings should be
    with pytest.warns(ConvergenceWarning) as caught:
        optimize(gmm_1d, _mixture(), max_its=2, seed=0)
    assert caught[0].filename == __file__


def test_the_warning_is_filterable_and_silent_when_not_earned(gmm_1d):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(gmm_1d, _mixture(), max_its=3, delta=None, seed=0)  # a fixed count on purpose: no warning
        fit(gmm_1d, _mixture(), max_its=500, delta=1e-2, seed=0)  # converged: no warning
        warnings.simplefilter("ignore", ConvergenceWarning)  # as scikit-learn's is silenced
        fit(gmm_1d, _mixture(), max_its=2, seed=0)
    assert mixle_parallel.ConvergenceWarning is ConvergenceWarning


def test_tol_is_a_gain_of_the_mean_log_likelihood_per_row(gmm_1d):
    rows = len(gmm_1d)
    by_tol = fit(gmm_1d, _mixture(), max_its=500, seed=5, tol=1e-4)
    by_delta = fit(gmm_1d, _mixture(), max_its=500, seed=5, delta=1e-4 * rows)
    assert by_tol.converged and by_tol.history == by_delta.history
    gains = np.diff(by_tol.history) / rows
    assert abs(gains[-1]) < 1e-4 and np.all(np.abs(gains[:-1]) >= 1e-4)
    with pytest.warns(ConvergenceWarning, match=r"not below tol=1e-12 per row"):
        fit(gmm_1d, _mixture(), max_its=2, seed=5, tol=1e-12)


def test_tol_and_delta_together_are_refused_by_name(gmm_1d):
    for delta in (1e-9, 1e-3, None):
        with pytest.raises(ValueError, match=r"tol=0.001 and delta=.*give one of them"):
            fit(gmm_1d, _mixture(), max_its=5, delta=delta, tol=1e-3)
    with pytest.raises(ValueError, match="tol must be a finite number > 0"):
        optimize(gmm_1d, _mixture(), tol=-1.0)


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, fit
    rows = np.random.default_rng(0).normal(size=2000)
    slow = sys.argv[1] == "slow"
    pause = (lambda step: time.sleep(1.5)) if slow else None  # a fit of a few seconds, or a quick one
    res = fit(rows, MixtureEstimator([GaussianEstimator()] * 2), max_its=5, delta=None, seed=0, on_step=pause)
    print("DONE", res.iterations, flush=True)
""")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TERM": "xterm"}


def _under_pty(kind: str) -> str:
    """Run the child with stdout and stderr on a pseudo-terminal; everything it wrote there."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's 24x100 size
    child = subprocess.Popen([sys.executable, "-c", CHILD, kind], stdin=subprocess.DEVNULL, stdout=follower,
                             stderr=follower, env=_env(), cwd=ROOT)
    os.close(follower)
    out = bytearray()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out.extend(chunk)
    child.wait(timeout=60)
    os.close(leader)
    assert child.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_progress_is_shown_on_a_terminal_for_a_fit_of_a_few_seconds():
    seen = _under_pty("slow")
    assert "DONE 5" in seen
    assert "EM:" in seen and "/5" in seen, seen  # tqdm's bar, drawn on the terminal


def test_a_quick_fit_on_a_terminal_shows_no_bar():
    seen = _under_pty("quick")
    assert "DONE 5" in seen and "EM:" not in seen, seen


def test_nothing_is_written_into_pipes_by_default():
    done = subprocess.run([sys.executable, "-c", CHILD, "slow"], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "DONE 5\n" and done.stderr == ""
