"""The launcher examples (examples/launchers/*.py), imported by file path.

The examples are scripts: run as ``python examples/launchers/<name>.py`` they import their sibling
``tiny_ddp`` from their own folder. Tests load them here under the same top-level names, with no
change to the import path: a module is registered in ``sys.modules`` before it runs, so ``import
tiny_ddp`` inside an example finds the loaded one. Processes that import an example by name
themselves (Ray workers unpickling ``tiny_ddp.train``, a job script) get ``EXAMPLES`` on their
PYTHONPATH instead.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "launchers"


def load_example(name: str) -> ModuleType:
    """``examples/launchers/<name>.py`` as the module ``name`` (loaded once, then taken from sys.modules)."""
    if name in sys.modules:
        return sys.modules[name]
    if name != "tiny_ddp":
        load_example("tiny_ddp")  # every other example imports it by name
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"no example {name!r} in {EXAMPLES}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
