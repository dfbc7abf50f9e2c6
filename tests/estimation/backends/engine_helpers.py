"""Helpers for the engine-backend tests: probe functions pickled by value, mpiexec runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The ranks' working directory: ``python -m tests.estimation.backends.mpi_scripts.<name>`` imports from there."""
SCRIPTS = "tests.estimation.backends.mpi_scripts"


def by_value(module: Any) -> None:
    """Pickle ``module``'s functions by value for every engine's cloudpickle flavour present."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    for name in ("ray.cloudpickle", "pyspark.cloudpickle"):
        if name.split(".")[0] in sys.modules:
            try:
                __import__(name)
                sys.modules[name].register_pickle_by_value(module)
            except (ImportError, AttributeError):  # pragma: no cover - older vendored copies
                pass


def mpiexec() -> str | None:
    """The mpiexec installed beside mpi4py's MPI (the mpich wheel), else the one on PATH."""
    import importlib.util

    candidates = [Path(sys.executable).parent / "mpiexec"]
    spec = importlib.util.find_spec("mpi4py")
    if spec is not None and spec.origin:
        # <prefix>/lib/pythonX.Y/site-packages/mpi4py/__init__.py -> <prefix>/bin/mpiexec
        candidates.append(Path(spec.origin).resolve().parents[4] / "bin" / "mpiexec")
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    return shutil.which("mpiexec")


def mpi_env(exe: str) -> dict[str, str]:
    """Environment for ranks: the MPI library of ``exe``'s install on the loader path."""
    env = dict(os.environ)
    lib = str(Path(exe).resolve().parent.parent / "lib")
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def run_mpi(
    script: str, n: int, *args: str, timeout: float = 240.0, abort_on_error: bool = False, check: bool = True
) -> list[dict[str, Any]]:
    """Run ``mpi_scripts/script`` (as the module ``tests.estimation.backends.mpi_scripts.<name>``) on ``n`` ranks;
    each rank writes ``$MPI_TEST_OUT/rank<r>.json``.

    ``abort_on_error`` runs the ranks as ``python -m mpi4py`` (an uncaught error aborts the job);
    ``check=False`` returns whatever ranks wrote even when the job failed.
    """
    import tempfile

    exe = mpiexec()
    if exe is None:
        pytest.skip("no mpiexec found: install the [mpi] extra (mpi4py + mpich)")
    with tempfile.TemporaryDirectory(prefix="mpi-test-") as out:
        env = mpi_env(exe)
        env["MPI_TEST_OUT"] = out
        proc = subprocess.run(
            [exe, "-n", str(n), sys.executable, *(["-m", "mpi4py"] if abort_on_error else []),
             "-m", f"{SCRIPTS}.{script.removesuffix('.py')}", *args],
            capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO_ROOT),
        )
        assert proc.returncode == 0 or not check, f"mpiexec -n {n} {script} failed:\n{proc.stdout}\n{proc.stderr}"
        rows = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    if check:
        assert sorted(r["rank"] for r in rows) == list(range(n)), proc.stdout + proc.stderr
    return sorted(rows, key=lambda r: r["rank"])


_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def launch_two_ranks(backend: str, module: str, args: list[str], home: Path,
                     out: Path) -> tuple[list[dict[str, Any]], str]:
    """Run ``python -m module backend *args`` as a real 2-rank job (``mpiexec -n 2`` for ``mpi``, ``torchrun
    --standalone`` otherwise) on the trust store at ``home``; each rank writes ``rank<r>.json`` into ``out``
    (which ``args`` names). Returns those and the job's stderr; skips where mpi4py or mpiexec is missing."""
    if backend == "mpi":
        pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
        exe = mpiexec()
        if exe is None:
            pytest.skip("no mpiexec found: install the [mpi] extra (mpi4py + mpich)")
        command, env = [exe, "-n", "2", sys.executable, "-m", module], mpi_env(exe)
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                   module]
        env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env = {**env, "MIXLE_PARALLEL_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("MIXLE_PARALLEL_CERTIFICATE", None)
    done = subprocess.run([*command, backend, *args], env=env, cwd=str(REPO_ROOT), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], done.stderr
