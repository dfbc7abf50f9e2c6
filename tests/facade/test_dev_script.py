"""``scripts/dev`` puts the venv's ``mixle-parallel`` within reach: ``scripts/dev run ARGS`` runs it, and until
``.venv/bin`` is on PATH every subcommand says how to put it there.

The script runs against a stand-in venv (``MIXLE_VENV``) that is already installed (its stamp is newer than
``pyproject.toml``) and a stand-in ``java`` and ``chromium``, so nothing is installed; its ``mixle-parallel``
echoes what it got.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "scripts" / "dev"


def _stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    """A ready venv whose ``mixle-parallel`` prints its arguments and MIXLE_PARALLEL_CLI; a bin with java, chromium."""
    venv, tools = tmp_path / "venv", tmp_path / "tools"
    (venv / "bin").mkdir(parents=True)
    tools.mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    cli = venv / "bin" / "mixle-parallel"
    cli.write_text('#!/bin/sh\necho "args: $*"\necho "cli: $MIXLE_PARALLEL_CLI"\n')
    java, chromium = tools / "java", tools / "chromium"
    java.write_text("#!/bin/sh\nexit 0\n")
    chromium.write_text("#!/bin/sh\nexit 0\n")
    for script in (cli, java, chromium):
        script.chmod(0o755)
    (venv / ".mixle-installed").touch()  # newer than pyproject.toml and the constraints: no install
    return venv, tools


def _dev(args: list[str], venv: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MIXLE_VENV": str(venv), "PATH": path}
    return subprocess.run(["bash", str(DEV), *args], env=env, capture_output=True, text=True, timeout=120)


def test_dev_run_reaches_the_venvs_cli_and_says_how_to_put_it_on_path(tmp_path: Path) -> None:
    venv, tools = _stand_ins(tmp_path)
    done = _dev(["run", "audit", "mixle-parallel-run/ledger.jsonl"], venv, f"{tools}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["args: audit mixle-parallel-run/ledger.jsonl", f"cli: {DEV} run"]
    assert f'export PATH="{venv}/bin:$PATH"' in done.stderr and f"`{DEV} run ARGS`" in done.stderr


def test_dev_is_quiet_about_path_once_the_venv_is_on_it(tmp_path: Path) -> None:
    venv, tools = _stand_ins(tmp_path)
    done = _dev(["setup"], venv, f"{venv}/bin:{tools}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert "export PATH" not in done.stderr
    done = _dev(["setup"], venv, f"{tools}:/usr/bin:/bin")
    assert "export PATH" in done.stderr  # every subcommand, setup included, says it while it is needed
