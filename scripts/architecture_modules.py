"""Write docs/architecture.md's module lists from the tree: every module with the first line of its docstring.

``python scripts/architecture_modules.py`` rewrites the text between the markers in docs/architecture.md;
``--check`` only compares and exits 1 when the doc has drifted from the tree (tests/test_architecture.py runs
the same comparison). The output depends on the files alone: folders and modules in sorted order, no dates.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- BEGIN MODULE LIST: written by scripts/architecture_modules.py, do not edit by hand -->"
END = "<!-- END MODULE LIST -->"
PACKAGES = (("contracts", "mixle_parallel.contracts"), ("verification", "mixle_parallel.verification"),
            ("executors", "mixle_parallel.executors"), ("mixle_parallel", "mixle_parallel"))
"""The code folders in dependency order, and the package each one is installed as."""


def first_docstring_line(path: Path) -> str:
    """The first line of the module's docstring, or a note that it has none (so the gap shows in the doc)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return doc.strip().splitlines()[0].strip() if doc and doc.strip() else "(no module docstring)"


def _folders(top: Path) -> list[Path]:
    """Every package folder under ``top`` (``top`` included), sorted; symbolic links are not followed."""
    found = []
    for folder, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not (Path(folder) / d).is_symlink())
        if "__init__.py" in files:
            found.append(Path(folder))
    return sorted(found, key=lambda p: p.relative_to(ROOT).as_posix())


def module_lists() -> str:
    """The generated Markdown: one heading per package folder, one bullet per module."""
    lines: list[str] = []
    for top, package in PACKAGES:
        for folder in _folders(ROOT / top):
            rel = folder.relative_to(ROOT).as_posix()
            dotted = ".".join([package, *folder.relative_to(ROOT / top).parts])
            lines += ["", f"#### `{rel}/` (`{dotted}`)", "", first_docstring_line(folder / "__init__.py"), ""]
            for module in sorted(p for p in folder.glob("*.py") if p.name != "__init__.py" and not p.is_symlink()):
                lines.append(f"- `{module.name}`: {first_docstring_line(module)}")
    return "\n".join(lines).lstrip("\n") + "\n"


def rendered(doc: str) -> str:
    """``doc`` with the text between the markers replaced by today's module lists."""
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise SystemExit(f"{DOC} must hold the markers {BEGIN!r} and {END!r} once each, in that order")
    head, rest = doc.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n\n{module_lists()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the doc (default) or, with ``--check``, report whether it matches the tree."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when the doc has drifted")
    args = parser.parse_args(argv)
    doc = DOC.read_text(encoding="utf-8")
    new = rendered(doc)
    if args.check:
        if new != doc:
            print(f"{DOC.relative_to(ROOT)} lists other modules than the tree: run "
                  "python scripts/architecture_modules.py", file=sys.stderr)
            return 1
        return 0
    if new != doc:
        DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
