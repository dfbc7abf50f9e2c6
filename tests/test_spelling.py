"""One spelling per concept, checked over the tree: a second spelling creeping back in fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_in_situ_is_spelled_one_way():
    """Identifiers, module and file names, options and keys say ``in_situ`` (prose says "in situ"), never ``insitu``."""
    variant = re.compile(r"insitu|Insitu|INSITU")  # InSitu is in_situ in CamelCase
    offenders = [p.relative_to(ROOT).as_posix() for p in _tracked() if variant.search(p.relative_to(ROOT).as_posix())]
    for path in _tracked():
        if path.suffix in {".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".cfg", ".txt"}:
            text = path.read_text(encoding="utf-8", errors="replace")
            offenders += [f"{path.relative_to(ROOT).as_posix()}:{text.count(chr(10), 0, m.start()) + 1}"
                          for m in variant.finditer(text) if path.name != "test_spelling.py"]
    assert not offenders, f"spell it in_situ (identifiers) or 'in situ' (prose): {offenders}"


def test_the_transports_are_backends_and_the_compute_kernels_engines():
    """``backend=`` picks the transport and ``engine=`` the E-step's compute (DESIGN §9, mixle 0.8.2's words): the EM
    transports live in ``executors/estimation/backends/``, no folder or module path names them ``engines``, and the
    compute engines (``torch_engine``, ``torch_kernels``) sit with the E-step in ``em_pass/``."""
    estimation = ROOT / "executors" / "estimation"
    assert (estimation / "backends" / "builtin_backends.py").is_file()
    assert (estimation / "em_pass" / "torch_engine.py").is_file()
    offenders = [p.relative_to(ROOT).as_posix() for p in _tracked() if "engines" in p.relative_to(ROOT).parts]
    for path in _tracked():
        if path.suffix in {".py", ".md", ".toml", ".sh", ".cfg"} and path.name != "test_spelling.py":
            text = path.read_text(encoding="utf-8", errors="replace")
            offenders += [f"{path.relative_to(ROOT).as_posix()}: {m.group(0)}"
                          for m in re.finditer(r"estimation[./]engines\b", text)]
    assert not offenders, f"the EM transports are backends (executors/estimation/backends/): {offenders}"
