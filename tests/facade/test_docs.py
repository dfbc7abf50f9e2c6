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
