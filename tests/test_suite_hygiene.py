"""Rules the test suite keeps so that one test cannot break later ones in the same process."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

_CLEARS_MODULES = re.compile(r"patch\.dict\(\s*['\"]?sys\.modules|sys\.modules\.clear\(|\bpytester\b")


def test_no_test_clears_sys_modules() -> None:
    # unittest.mock.patch.dict(sys.modules, ...) and the pytester fixture restore sys.modules by clearing it and
    # filling it again. An engine's thread (Ray, Spark, dask, torch) that imports in that instant finds nothing and
    # imports again; a second _io module then raises exceptions io.UnsupportedOperation no longer catches (CI once
    # saw torch.load fail so in a later test). monkeypatch.setitem(sys.modules, name, module) changes one key.
    found = [f"{path.relative_to(TESTS)}:{n}" for path in sorted(TESTS.rglob("*.py")) if path != Path(__file__)
             for n, line in enumerate(path.read_text().splitlines(), 1) if _CLEARS_MODULES.search(line)]
    assert not found, f"these lines clear sys.modules while the session's engines run: {found}"
