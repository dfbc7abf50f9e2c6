"""Every example in README.md and docs/*.md runs as written, one test per block (``FILE:LINE``).

A ```python block is a complete program: it is written to ``block.py`` in a fresh scratch folder and run
there with the project's interpreter (``python block.py``). A first line ``# run: torchrun --nproc-per-node N``
or ``# run: mpiexec -n N`` says how to launch it: ``python -m torch.distributed.run --standalone
--nproc-per-node N block.py`` or the venv's ``mpiexec -n N python block.py``; a first comment that names
torchrun or mpiexec in another form is refused (it would run as one process). A block that starts processes
(a launch line, a launcher, an EM backend other than ``local``, Ray, Spark, Dask, or the CLI's ``verify``,
``certify``, ``conformance`` and ``demo``) is ``slow`` (``_STARTS_PROCESSES``). A python block whose first line
is ``# file: NAME.py`` is a module a later block uses: it is saved as ``NAME.py`` in the scratch folder of every
later block of the same document (and runs as a program too). A ```bash block runs in
``bash -e`` from the scratch folder with the venv's ``bin`` first on PATH, so ``mixle-parallel ...`` is the
venv's console script. Exempt by name, and only these: the README's two
quick-start commands (``QUICK_START``), which CI runs itself (``.ci/run`` runs ``scripts/dev test``, and
``tests/facade/test_demo.py`` runs the demo). A block that is not a program is fenced ```text (or json, yaml,
...); a fence without a language is refused, so every block says what it is.

Each block gets its own certificate store (``MIXLE_PARALLEL_HOME`` under its temporary folder), as on a
fresh machine, and a timeout; a failure prints the block's output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
QUICK_START = ("scripts/dev run demo", "scripts/dev test")
"""The README's quick-start commands: exempt, because CI runs them itself (they build the venv these tests use)."""
EXECUTED = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
"""Fence languages that are programs, and how each runs."""
TIMEOUT_S = 300
SLOW_TIMEOUT_S = 900
_STARTS_PROCESSES = re.compile(
    r"^#\s*run:|Launcher\b|\bimport ray\b|\bpyspark\b|\bdask\b|\bfrom distributed\b|"
    r"backend=[\"'](mp|mpi|ray|dask|spark|torchrun|lightning)[\"']|"
    r"\bmixle-parallel\s+(verify|certify|conformance|demo)\b", re.MULTILINE)
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)")
_LAUNCH = re.compile(r"^#\s*run:\s*(?P<command>.*?)\s*$")
_TORCHRUN = re.compile(r"^torchrun\s+(--standalone\s+)?--nproc-per-node[ =](?P<n>[1-9]\d*)$")
_MPIEXEC = re.compile(r"^mpiexec\s+-n\s+(?P<n>[1-9]\d*)$")
_NAMES_A_LAUNCHER = re.compile(r"^#.*\b(torchrun|mpiexec|mpirun)\b")
_FILE = re.compile(r"^#\s*file:\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*\.py)\s*$")


@attrs.frozen
class Example:
    """One fenced block of a document: where it is, its language and its text (dedented to the fence)."""

    path: Path
    line: int
    language: str
    code: str

    @property
    def id(self) -> str:
        """``FILE:LINE`` of the opening fence, relative to the repository."""
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{where}:{self.line}"

    @property
    def runner(self) -> str | None:
        """``python`` or ``bash`` for a program, None for a block that is not one (text, json, ...)."""
        return EXECUTED.get(self.language.lower())

    @property
    def launch_line(self) -> str | None:
        """The command of a ``# run: ...`` first line, if the block has one."""
        first = self.code.lstrip("\n").split("\n", 1)[0]
        match = _LAUNCH.match(first)
        return match["command"] if match else None

    @property
    def file_name(self) -> str | None:
        """``NAME.py`` for a block whose first line is ``# file: NAME.py`` (a module later blocks import)."""
        first = self.code.lstrip("\n").split("\n", 1)[0]
        match = _FILE.match(first)
        return match["name"] if match and self.runner == "python" else None

    @property
    def starts_processes(self) -> bool:
        """True for a block that starts processes (see ``_STARTS_PROCESSES``): marked ``slow``."""
        return _STARTS_PROCESSES.search(self.code) is not None

    @property
    def is_quick_start(self) -> bool:
        """True for a bash block made only of the README's quick-start commands."""
        commands = [_strip_comment(line) for line in self.code.splitlines()]
        commands = [c for c in commands if c]
        return self.runner == "bash" and bool(commands) and all(c in QUICK_START for c in commands)


def _strip_comment(line: str) -> str:
    return line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""


def extract_examples(path: Path) -> list[Example]:
    """Every fenced block of a Markdown document, in order (an unclosed fence runs to the end)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    examples, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = "\n".join(line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1:j])
        examples.append(Example(path=path, line=i + 1, language=match["info"], code=body + "\n"))
        i = j + 1
    return examples


def launch_command(example: Example, script: str) -> list[str]:
    """How to start a python block: ``python block.py``, or what its ``# run:`` line says."""
    launch = example.launch_line
    if launch is None:
        first = example.code.lstrip("\n").split("\n", 1)[0]
        if _NAMES_A_LAUNCHER.match(first):  # "# x.py -- run with: torchrun ...": would run as one process
            raise AssertionError(f"{example.id}: the first line names a launcher but is no launch line; write "
                                 "'# run: torchrun --nproc-per-node N' or '# run: mpiexec -n N'")
        return [sys.executable, script]
    if match := _TORCHRUN.match(launch):
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", match["n"], script]
    if match := _MPIEXEC.match(launch):
        return [str(VENV_BIN / "mpiexec"), "-n", match["n"], sys.executable, script]
    raise AssertionError(
        f"{example.id}: unknown launch line '# run: {launch}'; write '# run: torchrun --nproc-per-node N' or "
        "'# run: mpiexec -n N'")


ALL = [e for path in DOCUMENTS for e in extract_examples(path)]
PROGRAMS = [e for e in ALL if e.runner is not None and not e.is_quick_start]


def _param(example: Example) -> object:
    marks = [pytest.mark.slow] if example.starts_processes else []
    return pytest.param(example, id=example.id, marks=marks)


def _environment(home: Path) -> dict[str, str]:
    """The project's environment: this checkout importable, the venv's bin first on PATH, a fresh store."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env["PATH"] = os.pathsep.join(p for p in (str(VENV_BIN), os.environ.get("PATH")) if p)
    env["MIXLE_PARALLEL_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _files_before(example: Example) -> list[Example]:
    """The ``# file: NAME.py`` blocks above ``example`` in its document, saved beside it."""
    return [e for e in ALL if e.path == example.path and e.line < example.line and e.file_name]


@pytest.mark.parametrize("example", [_param(e) for e in PROGRAMS])
def test_example_runs_as_written(example: Example, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for module in _files_before(example):
        (scratch / str(module.file_name)).write_text(module.code, encoding="utf-8")
    if example.runner == "python":
        (scratch / "block.py").write_text(example.code, encoding="utf-8")
        command = launch_command(example, "block.py")
    else:
        (scratch / "block.sh").write_text(example.code, encoding="utf-8")
        command = ["bash", "-e", "block.sh"]
    timeout = SLOW_TIMEOUT_S if example.starts_processes else TIMEOUT_S
    try:
        done = subprocess.run(command, cwd=scratch, env=_environment(tmp_path / "home"), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"")[-4000:], (err.stderr or b"")[-6000:]
        pytest.fail(f"{example.id} did not finish within {timeout} s: {shlex.join(command)}\n{output}")
    assert done.returncode == 0, (
        f"{example.id} exited with {done.returncode} ({shlex.join(command)} in a fresh folder)\n"
        f"--- block ---\n{example.code}--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-6000:]}")


def test_every_block_names_its_language() -> None:
    unnamed = [e.id for e in ALL if not e.language]
    assert ALL and not unnamed, (
        f"{', '.join(unnamed)}: a fence without a language; fence a program as ```python or ```bash (it is then "
        "executed), anything else as ```text (or json, yaml, ...)")


def test_only_the_quick_start_is_exempt() -> None:
    exempt = [e for e in ALL if e.is_quick_start]
    assert [e.path.name for e in exempt] == ["README.md"], [e.id for e in exempt]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/dev test" in ci  # the quick start's second command is what CI runs


def test_the_extractor_reads_fences_launch_lines_and_the_exemption(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("text\n```python\n# run: torchrun --nproc-per-node 2\nprint(1)\n```\n\n"
                   "- item\n\n  ```bash\n  mixle-parallel plan --tp 2\n  ```\n"
                   "```bash\nscripts/dev run demo   # the job\nscripts/dev test\n```\n````text\n```\n````\n")
    py, sh, quick, text = extract_examples(doc)
    assert (py.line, py.language, py.launch_line) == (2, "python", "torchrun --nproc-per-node 2")
    assert launch_command(py, "b.py")[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                              "2", "b.py"]
    assert sh.code == "mixle-parallel plan --tp 2\n" and sh.runner == "bash" and not sh.is_quick_start
    assert quick.is_quick_start and text.runner is None and text.code == "```\n"
    assert py.starts_processes and not sh.starts_processes and py.id == "doc.md:2"
    bad = attrs.evolve(py, code="# run: torchrun -n 2\n")
    with pytest.raises(AssertionError, match="unknown launch line"):
        launch_command(bad, "b.py")
    informal = attrs.evolve(py, code="# job.py -- run with: torchrun --standalone --nproc-per-node 2 job.py\n")
    with pytest.raises(AssertionError, match="no launch line"):
        launch_command(informal, "b.py")
    assert launch_command(attrs.evolve(py, code="print(2)\n"), "b.py") == [sys.executable, "b.py"]
    standalone = attrs.evolve(py, code="# run: torchrun --standalone --nproc-per-node 3\n")
    assert launch_command(standalone, "b.py")[-2:] == ["3", "b.py"]
    module = attrs.evolve(py, code="# file: acme_backend.py\nX = 1\n", line=40)
    assert module.file_name == "acme_backend.py" and py.file_name is None
    assert attrs.evolve(sh, code="# file: x.py\n").file_name is None  # only python blocks are modules
    mpi = attrs.evolve(py, code="# run: mpiexec -n 4\n")
    assert launch_command(mpi, "b.py") == [str(VENV_BIN / "mpiexec"), "-n", "4", sys.executable, "b.py"]
