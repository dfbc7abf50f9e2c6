"""Docs generated from code stay current; every public name has a docstring."""

from __future__ import annotations

import inspect
import runpy
from pathlib import Path

import mixle_parallel

ROOT = Path(__file__).resolve().parents[2]


def test_contracts_doc_is_current() -> None:
    generator = runpy.run_path(str(ROOT / "docs" / "gen_contracts.py"))
    expected = generator["render"]()
    assert (ROOT / "docs" / "contracts.md").read_text(encoding="utf-8") == expected, (
        "docs/contracts.md is stale: run `python docs/gen_contracts.py`"
    )


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for name in mixle_parallel.__all__:
        obj = getattr(mixle_parallel, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not (obj.__doc__ or "").strip():
            missing.append(name)
    assert not missing, f"public names without a docstring: {missing}"


def test_one_guide_to_writing_a_backend() -> None:
    """docs/estimation_backends.md holds the guide (a module, then verify/certify/conformance with JUnit XML); the
    other places link to it instead of repeating it (issue 35 item 7)."""
    guide = (ROOT / "docs" / "estimation_backends.md").read_text(encoding="utf-8")
    section = guide.split("## Writing a backend", 1)[1]
    assert "# file: acme_backend.py" in section and "register_encoded_data_backend(" in section
    for command in ("verify", "certify", "conformance"):
        assert f"mixle-parallel {command} --backend acme_em" in section and f"--junit-xml {command}.xml" in section
    for other in ("docs/estimation.md", "docs/verification.md", "examples/em_backend_template.py"):
        text = (ROOT / other).read_text(encoding="utf-8")
        assert "estimation_backends.md" in text and "Writing a backend" in text, other
    for doc in ("docs/estimation.md", "docs/verification.md"):
        blocks = (ROOT / doc).read_text(encoding="utf-8").split("```")[1::2]
        assert not [b for b in blocks if "register_encoded_data_backend(" in b], f"{doc} repeats the guide"


def test_every_file_the_docs_name_exists() -> None:
    """A path into this repository named in README.md or docs/ (``executors/.../x.py``) is a file that exists:
    the docs moved with the modules (two paths were left behind by the estimation wing's reshaping)."""
    import re

    named = re.compile(r"\b(?:executors|verification|contracts|mixle_parallel|tests|benchmarks|examples|scripts)"
                       r"/[A-Za-z0-9_/.-]+\.(?:py|md|json|toml)")
    missing = sorted({f"{doc.relative_to(ROOT)}: {path}"
                      for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
                      for path in named.findall(doc.read_text(encoding="utf-8")) if not (ROOT / path).exists()})
    assert not missing, f"the docs name files that do not exist: {missing}"
