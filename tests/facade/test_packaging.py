"""Building the package prints no warning about our own metadata (``pyproject.toml``), and the wheel says its license.

``pip wheel --no-deps .`` is what ``.ci/run`` builds: an isolated build that installs ``setuptools>=77`` from
the configured index (the local one where the machine has it) and runs our ``pyproject.toml`` through it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_METADATA_WARNING = re.compile(r"(?i)deprecat|BuildBackendWarning|SetuptoolsWarning|pyproject\.toml.*warn|"
                               r"project\.license")


def test_wheel_builds_without_a_warning_from_our_metadata(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", "mixle-parallel-run"))
    wheels = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(wheels),
                           str(source)], capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    warnings = [line for line in output.splitlines() if _METADATA_WARNING.search(line)]
    assert not warnings, "\n".join(warnings)
    (wheel,) = wheels.glob("mixle_parallel-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text.splitlines()
