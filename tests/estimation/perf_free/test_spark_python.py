"""A SparkContext the spark engine creates runs its Python workers on the driver's interpreter (issue 25 item 6),
unless the user named one: a venv install works without setting PYSPARK_PYTHON."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = textwrap.dedent("""
    import numpy as np
    from mixle_parallel import GaussianEstimator, encoded_data
    if __name__ == "__main__":
        with encoded_data(np.arange(40.0), estimator=GaussianEstimator(), backend="spark", num_workers=2) as h:
            print("fitted", h.num_workers)
""")


def _fit(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fit.py").write_text(SCRIPT, encoding="utf-8")
    base = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "fit.py"], cwd=tmp_path, env={**base, **env}, capture_output=True,
                          text=True, timeout=300)


def _executable(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.slow
def test_workers_run_the_drivers_interpreter_when_python3_on_path_is_another(tmp_path):
    # Spark's default worker command is "python3" on PATH: here one that cannot import this package
    shadow = tmp_path / "bin"
    shadow.mkdir()
    _executable(shadow / "python3", "#!/bin/sh\necho 'not the venv python' >&2\nexit 3\n")
    done = _fit(tmp_path, PATH=f"{shadow}{os.pathsep}{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fitted 2" in done.stdout


@pytest.mark.slow
def test_a_python_the_user_named_is_kept(tmp_path):
    marker = tmp_path / "used"
    wrapper = _executable(tmp_path / "py", f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
    done = _fit(tmp_path, PYSPARK_PYTHON=str(wrapper))
    assert done.returncode == 0, done.stderr[-3000:]
    assert marker.exists(), "the user's PYSPARK_PYTHON was replaced by the driver's interpreter"
